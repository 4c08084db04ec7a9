"""A task's outgoing messages, delivered one at a time and in order (sans-IO).

The runtime (`synapse.runtime.protocol`) keeps one `TaskQueue` per task with messages to POST,
and so does the model checker (`synapse.model`), which explores the same rules: what the
queue holds, which message is on the wire, and what a drop takes away.

- `push` appends; only the head is ever sent (`start_sending`), and the next one only once
  the head was answered (`answered`). A failed attempt (`retry`) leaves it at the head.
- `drop` takes everything away, the head on the wire included: once an executor has
  acknowledged a `task_cancel`, and once a requester gave up on a task, nothing more is sent
  about it, not even a retry of what was on the wire. (A POST already made finishes; its
  answer, if any comes, changes nothing here.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class TaskQueue(Generic[T]):
    """The messages of one task waiting to be delivered, the head first."""

    __slots__ = ("_items", "sending")

    def __init__(self, items: tuple[T, ...] = ()) -> None:
        self._items: deque[T] = deque(items)
        #: True while the head is on the wire (a POST of it is in progress).
        self.sending = False

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    @property
    def head(self) -> T | None:
        return self._items[0] if self._items else None

    def push(self, item: T) -> None:
        self._items.append(item)

    def start_sending(self) -> T:
        """The head goes on the wire."""
        head = self._items[0]
        self.sending = True
        return head

    def retry(self) -> None:
        """The attempt failed: the head stays, to be sent again."""
        self.sending = False

    def answered(self, item: T) -> bool:
        """`item`'s POST was answered: it leaves the queue if it is still the head."""
        self.sending = False
        if self._items and self._items[0] is item:
            self._items.popleft()
            return True
        return False

    def drop(self) -> list[T]:
        """Everything, the head on the wire included (see the module docstring)."""
        dropped = list(self._items)
        self._items.clear()
        self.sending = False
        return dropped

    def copy(self) -> TaskQueue[T]:
        twin: TaskQueue[T] = TaskQueue(tuple(self._items))
        twin.sending = self.sending
        return twin


__all__ = ["TaskQueue"]
