"""The Runs this process wrote last, as its commits left them: an in-memory snapshot
per Run (docs/DESIGN.md, "Snapshots").

A write that commits puts the aggregate its decision left (`run_path.applied`)
here; the next load of that Run starts from it and reads only the records after
its stream versions (`actors.loading`). Nothing here is trusted beyond that: the
log is append-only and versions are never reused, so an aggregate folded from the
log up to some versions stays a true prefix of it. Another process appending in
between costs a longer tail, never a wrong answer.

Only committed aggregates come in (the caller puts them after the COMMIT
answered); a lost COMMIT response puts nothing. Bounded by weight — a Run weighs
its StepRuns and Attempts, what its aggregate's size grows with — so a few huge Runs
hold as little memory as many small ones: the least recently used Runs leave past
`capacity`; a Run that ended leaves at once (nothing decides about it any more).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from domain.aggregate import RunAggregate

DEFAULT_CAPACITY = 16_384  # StepRuns + Attempts held (a few hundred bytes each): ~8 MiB


def _weight(aggregate: RunAggregate) -> int:
    return 1 + len(aggregate.steps) + len(aggregate.attempts)


def _progress(aggregate: RunAggregate) -> tuple[int, int, int]:
    """How far into the log an aggregate is folded (grows with every append to a Run)."""
    return aggregate.version, aggregate.steps_version, sum(aggregate.lease_versions.values())


class AggregateCache:
    """Run id -> the newest committed aggregate of that Run this process holds."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._held: OrderedDict[str, RunAggregate] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, run_id: str) -> RunAggregate | None:
        """The held aggregate of `run_id`, if any."""
        with self._lock:
            found = self._held.get(run_id)
            if found is not None:
                self._held.move_to_end(run_id)
            return found

    def put(self, aggregates: Iterable[RunAggregate]) -> None:
        """Hold committed aggregates (an older one than held is ignored: two writers'
        answers may come back in either order)."""
        with self._lock:
            held = self._held
            for aggregate in aggregates:
                run_id = aggregate.run_id
                current = held.get(run_id)
                if current is not None and _progress(current) > _progress(aggregate):
                    continue
                if current is not None:
                    self._weight -= _weight(held.pop(run_id))
                if aggregate.run.is_terminal:
                    continue
                held[run_id] = aggregate
                self._weight += _weight(aggregate)
            while self._weight > self.capacity and held:
                _, oldest = held.popitem(last=False)
                self._weight -= _weight(oldest)

    def clear(self) -> None:
        """Forget every Run."""
        with self._lock:
            self._held.clear()
            self._weight = 0

    def __len__(self) -> int:
        return len(self._held)
