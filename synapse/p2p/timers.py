"""One timer queue for every task and partner: a heap with lazy cancellation.

10,000 tasks in flight cost 10,000 heap entries, not 10,000 sleeping coroutines; the driver
sleeps once, until `next_deadline()`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class TimerQueue(Generic[K]):
    """Timers keyed by `K`; setting a key again replaces its previous deadline.

    With `owner`, each key belongs to an owner (a task, a partner) and the timers of one
    owner are read and replaced as one value (`owned`, `replace_owned`): whatever timers an
    owner has, never a list of them kept elsewhere.
    """

    __slots__ = ("_armed", "_heap", "_owned", "_owner", "_seq", "_when")

    def __init__(self, owner: Callable[[K], Hashable] | None = None) -> None:
        self._heap: list[tuple[float, int, K]] = []
        self._armed: dict[K, int] = {}
        self._when: dict[K, float] = {}
        self._seq = itertools.count()
        self._owner = owner
        self._owned: dict[Hashable, set[K]] = {}

    def set(self, key: K, when: float) -> None:
        seq = next(self._seq)
        self._armed[key] = seq
        self._when[key] = when
        if self._owner is not None:
            self._owned.setdefault(self._owner(key), set()).add(key)
        heapq.heappush(self._heap, (when, seq, key))
        # Replaced and cancelled entries stay in the heap until popped; compact when they
        # clearly outnumber the live ones so memory stays proportional to live timers.
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._armed):
            self._heap = [e for e in self._heap if self._armed.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def copy(self) -> TimerQueue[K]:
        """An independent queue with the same timers armed."""
        twin: TimerQueue[K] = TimerQueue(self._owner)
        twin._heap = list(self._heap)
        twin._armed = dict(self._armed)
        twin._when = dict(self._when)
        twin._seq = itertools.count(next(self._seq))
        twin._owned = {owner: set(keys) for owner, keys in self._owned.items()}
        return twin

    def armed(self) -> dict[K, float]:
        """Every armed timer and when it is due."""
        return dict(self._when)

    def cancel(self, key: K) -> None:
        self._armed.pop(key, None)
        if self._when.pop(key, None) is not None and self._owner is not None:
            self._disown(key)

    def owned(self, owner: Hashable) -> dict[K, float]:
        """Every timer of `owner` and when it is due (needs `owner` at construction)."""
        return {key: self._when[key] for key in self._owned.get(owner, ())}

    def replace_owned(self, owner: Hashable, timers: Mapping[K, float]) -> None:
        """Make `timers` the timers of `owner`: its others are cancelled, these (re)armed."""
        for key in list(self._owned.get(owner, ())):
            if key not in timers:
                self.cancel(key)
        for key, when in timers.items():
            if self._when.get(key) != when:
                self.set(key, when)

    def _disown(self, key: K) -> None:
        assert self._owner is not None
        owner = self._owner(key)
        keys = self._owned.get(owner)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._owned[owner]

    def deadline(self, key: K) -> float | None:
        """When `key` is due, or None if it is not armed."""
        return self._when.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._armed

    def __len__(self) -> int:
        return len(self._armed)

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._armed.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)

    def next_deadline(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> Iterator[K]:
        """Yield (and disarm) every key whose deadline is at or before `now`, earliest first."""
        heap = self._heap
        while True:
            self._drop_stale()
            if not heap or heap[0][0] > now:
                return
            _, _, key = heapq.heappop(heap)
            del self._armed[key]
            del self._when[key]
            if self._owner is not None:
                self._disown(key)
            yield key
