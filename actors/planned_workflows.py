"""The Workflows this process has checked for admission: a publication's Workflow,
checked against its revision once (`domain.plan.plan_workflow`), serves every Run
started from it (docs/DESIGN.md, "Durable admission").

A published revision never changes (the publication's id names its digest), so
nothing here can go stale: what may change — the publication's status, its
publisher's trust, which publication is the head — is read again by every start.
Bounded: the least recently used Workflow leaves past `capacity`.

It also keeps, per package or installation name, the publisher the name last
resolved to: admission locks that publisher and reads the name under the lock in its
first round trip, and checks the guess there (a name now resolving to another
publisher is locked and read again), so a stale guess costs a round trip, never a
wrong answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from domain.plan import PlannedWorkflow

DEFAULT_CAPACITY = 64  # Workflows held


class PlannedWorkflows:
    """(publication id, workflow key) -> its PlannedWorkflow."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._held: OrderedDict[tuple[str, str], PlannedWorkflow] = OrderedDict()
        self._publishers: OrderedDict[str, str] = OrderedDict()  # name -> publisher
        self._lock = threading.Lock()

    def publisher_of(self, name: str) -> str | None:
        """The publisher `name` last resolved to in this process, if held."""
        with self._lock:
            return self._publishers.get(name)

    def resolved(self, name: str, publisher: str) -> None:
        """`name` resolved to a publication of `publisher`, under its lock."""
        with self._lock:
            self._publishers[name] = publisher
            self._publishers.move_to_end(name)
            while len(self._publishers) > self.capacity:
                self._publishers.popitem(last=False)

    def get(self, publication_id: str, workflow_key: str) -> PlannedWorkflow | None:
        """The held PlannedWorkflow, if any."""
        with self._lock:
            found = self._held.get((publication_id, workflow_key))
            if found is not None:
                self._held.move_to_end((publication_id, workflow_key))
            return found

    def any_of(self, publication_id: str) -> PlannedWorkflow | None:
        """A held Workflow of the publication (its revision is the publication's)."""
        with self._lock:
            return next(
                (planned for (pub, _), planned in self._held.items() if pub == publication_id),
                None,
            )

    def put(self, planned: PlannedWorkflow) -> None:
        """Hold a checked Workflow."""
        key = (planned.publication.publication_id, planned.workflow_key)
        with self._lock:
            self._held[key] = planned
            self._held.move_to_end(key)
            while len(self._held) > self.capacity:
                self._held.popitem(last=False)
