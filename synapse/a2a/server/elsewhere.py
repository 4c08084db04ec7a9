"""Views of A2A tasks another replica holds, kept in step with the shared store.

Replicas of one agent share a store (`synapse.store.leases`); a task's callbacks reach the
A2A view of the replica holding it, in that replica's memory. Behind a balancer, a client's
`GetTask` or `SubscribeToTask` may reach another replica: one that never held the task, or
one that let it go when another took it over. There the view would never move again, and a
stream on it would wait for ever. `ViewFollower` reads each such task from the store every
`interval` seconds and brings its view up to what was last committed: new or changed
artifacts, then the status (a terminal one ends the streams, and the view leaves memory as a
finished one does). Progress between two reads may be folded into one event; nothing of the
outcome is lost. A task this replica holds again (taken back) is caught up once more and
then moved by its callbacks, as any other.
"""

from __future__ import annotations

from typing import Protocol

from synapse.a2a.server.view import A2ATask, view_of_record
from synapse.p2p.engine import TaskKey
from synapse.runtime.following import StoreFollower
from synapse.runtime.protocol import P2PProtocol
from synapse.store.base import StoreUnavailable


class ViewsHost(Protocol):
    """What the follower needs of `A2AService`."""

    @property
    def bound(self) -> P2PProtocol | None: ...

    def evicted(self, key: TaskKey) -> None: ...


def catch_up(view: A2ATask, fresh: A2ATask) -> bool:
    """Bring `view` to `fresh` (the view of the task's stored record), publishing what
    changed to its streams; True if anything did. Compared by content (artifacts by id and
    parts, the status by state and message parts): what `view` annotated or summarised
    itself is not told again."""
    changed = False
    known = {a.artifact_id: a.parts for a in view.artifacts}
    for artifact in fresh.artifacts:
        if known.get(artifact.artifact_id) != artifact.parts:
            view.add_artifact(artifact)
            changed = True
    told, now = view.status_message, fresh.status_message
    if fresh.state != view.state or (
        (told.parts if told else None) != (now.parts if now else None)
    ):
        view.set_status(fresh.state, fresh.status_message)
        changed = True
    return changed


class ViewFollower(StoreFollower[A2ATask]):
    """The views of tasks this replica does not hold, followed in the store."""

    def __init__(self, service: ViewsHost, interval: float) -> None:
        super().__init__(interval)
        self._service = service
        #: The stored record each view was last brought to: (state, updated at, entries).
        self._seen: dict[TaskKey, tuple[object, ...]] = {}

    def follow(self, view: A2ATask) -> None:
        """Keep `view` in step with the store while another replica holds its task."""
        if not view.is_terminal:
            self._follow_one(view.key, view)

    def refresh(self) -> None:
        """One pass: each followed view caught up with its stored record."""
        protocol = self._service.bound
        if protocol is None:
            return
        for key, view in list(self._followed.items()):
            try:
                rec = protocol.view.get(key)
            except StoreUnavailable:
                continue  # read again next time
            held = protocol.view.holds(key)
            if rec is not None:
                seen = (rec.state, rec.updated_at, len(rec.audit))
                if self._seen.get(key) != seen:
                    self._seen[key] = seen
                    catch_up(view, view_of_record(rec))
            if held or rec is None or view.is_terminal:
                del self._followed[key]
                self._seen.pop(key, None)
                if view.is_terminal and not held:
                    self._service.evicted(key)  # as a task finished here leaves memory


__all__ = ["ViewFollower", "ViewsHost", "catch_up"]
