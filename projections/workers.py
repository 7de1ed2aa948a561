"""Who holds or recently held leases (docs/DESIGN.md, "Workers"), read from the
Attempts read model — no table of its own, so retention, rebuild and verify treat it
as they treat the Attempts.

Each Attempt row has the worker of its (last) lease, the host and slots the worker
said when it was granted (`lease.granted`'s `worker_host` and `worker_slots`, where
given), the last renewal while the lease is held, and when the Attempt started and
ended (runs schema step 12). A listing reads two index ranges: the partial index of
Attempts starting or running (what each worker runs now) and the Attempts that ended
since the window's start (`attempts_ended`): it costs the work in flight and the work
done in the window, never the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eventstore.api import Reads
from projections.runs_schema import ACTIVE_WHERE


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A worker that runs an Attempt now, or held one that ended since the window's
    start.

    `host` and `slots` are what it said when it was granted those Attempts' leases
    (None: it did not say); `running` counts its Attempts starting or running now,
    `expired` those among them whose lease ran out (its host is probably gone: the
    next cycle records them lost), `attempts` their ids; `last_renewal_ms` is its
    latest renewal of a lease it holds now; `ended` how many Attempts it held ended in
    the window, the latest at `last_ended_ms`; `last_seen_ms` the latest of its
    renewals, starts and ends. Times are epoch milliseconds.
    """

    worker_id: str
    host: str | None
    slots: int | None
    running: int
    expired: int
    attempts: tuple[str, ...]
    last_renewal_ms: int | None
    ended: int
    last_ended_ms: int | None
    last_seen_ms: int | None

    @property
    def holding(self) -> bool:
        """Whether it runs an Attempt under a live lease now."""
        return self.running > self.expired


_ACTIVE = (
    "SELECT worker_id, attempt_id, expires_at_ms, renewed_at_ms, started_at_ms, "
    f"worker_host, worker_slots, claimed_position FROM attempts WHERE {ACTIVE_WHERE}"
)
_ENDED = (
    "SELECT worker_id, COUNT(*), MAX(ended_at_ms), MAX(worker_host), MAX(worker_slots) "
    "FROM attempts WHERE ended_at_ms >= ? AND worker_id IS NOT NULL GROUP BY worker_id"
)


@dataclass
class _Seen:
    running: list[tuple[str, int | None]]
    renewed: int | None = None
    ended: int = 0
    last_ended: int | None = None
    started: int | None = None
    # (claim position, host, slots) of the latest Attempt running that said them
    said: tuple[int, str | None, int | None] | None = None


def list_workers(reader: Reads, now_ms: int, since_ms: int, limit: int = 1_000) -> list[WorkerView]:
    """Every worker that runs an Attempt now or held one that ended at or after
    `since_ms`, the most recently seen first, at most `limit` (see the module). An idle
    worker's host and slots are those its ended Attempts' grants said (one each, as a
    worker id is one process)."""
    active, ended = reader.query_all([(_ACTIVE, ()), (_ENDED, (since_ms,))])
    seen: dict[str, _Seen] = {}
    for worker_id, attempt_id, expires, renewed, started, host, slots, position in active:
        if worker_id is None:
            continue  # an Attempt started with no lease: none in a sound log
        worker = seen.setdefault(worker_id, _Seen([]))
        worker.running.append((attempt_id, expires))
        worker.renewed = _latest(worker.renewed, renewed)
        worker.started = _latest(worker.started, started)
        if worker.said is None or position > worker.said[0]:
            worker.said = (position, host, slots)
    for worker_id, count, last_ended, host, slots in ended:
        worker = seen.setdefault(worker_id, _Seen([]))
        worker.ended, worker.last_ended = int(count), last_ended
        if worker.said is None:
            worker.said = (0, host, slots)
    views = [_view(worker_id, worker, now_ms) for worker_id, worker in seen.items()]
    views.sort(key=lambda view: (-(view.last_seen_ms or 0), view.worker_id))
    return views[:limit]


def _latest(*instants: int | None) -> int | None:
    known = [at for at in instants if at is not None]
    return max(known) if known else None


def _view(worker_id: str, worker: _Seen, now_ms: int) -> WorkerView:
    _, host, slots = worker.said or (0, None, None)
    running: Sequence[tuple[str, Any]] = sorted(worker.running)
    return WorkerView(
        worker_id=worker_id,
        host=host,
        slots=slots,
        running=len(running),
        expired=sum(1 for _, expires in running if expires is not None and expires <= now_ms),
        attempts=tuple(attempt_id for attempt_id, _ in running),
        last_renewal_ms=worker.renewed,
        ended=worker.ended,
        last_ended_ms=worker.last_ended,
        last_seen_ms=_latest(worker.renewed, worker.started, worker.last_ended),
    )
