"""What a metrics scrape reads from the read models: the work waiting and running
per Task, and the Runs by status (docs/DESIGN.md, "Observability").

Every query reads an index, never the Runs' rows: the queue is the range of the grant
index that is open now (the Attempts a worker may lease: `projections.candidates`),
the running Attempts a partial index of those starting or running (schema step 7),
so each costs what waits or runs, not the history; the Runs by status are the rows of
`run_counts`, which triggers on `runs` keep (schema step 8): one row per status.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.transitions import RUN_RUNNING, RUN_TERMINAL
from eventstore.api import Reads
from projections.candidates import claimable_condition
from projections.runs_schema import ACTIVE_WHERE, COUNTS_TABLE

# claimable now: what `claimable_attempts` would hand a worker (the grant index)
_QUEUED = (
    "SELECT task_ref, COUNT(*), MIN(claimed_at_ms) FROM attempts "
    f"WHERE {claimable_condition()} GROUP BY task_ref"
)
# the partial index of schema step 7, by its own condition
_RUNNING = f"SELECT task_ref, COUNT(*) FROM attempts WHERE {ACTIVE_WHERE} GROUP BY task_ref"
_RUNS = f"SELECT status, runs FROM {COUNTS_TABLE}"  # kept by triggers (schema step 8)


@dataclass(frozen=True, slots=True)
class TaskQueue:
    """Attempts of one Task claimed and not leased: how many, and the oldest claim."""

    task_ref: str
    queued: int
    oldest_claim_ms: int


@dataclass(frozen=True, slots=True)
class Gauges:
    """One reading of the store's gauges."""

    queues: tuple[TaskQueue, ...]
    running: dict[str, int]  # task ref -> Attempts starting or running
    runs: dict[str, int]  # every Run status -> Runs in it (0 included)


def read_gauges(store: Reads, now_ms: int) -> Gauges:
    """The gauges at `now_ms`, in one round trip where the store can."""
    queries = [(_QUEUED, (now_ms, now_ms)), (_RUNNING, ()), (_RUNS, ())]
    queued, running, runs = store.query_all(queries)
    by_status = dict.fromkeys(sorted(s.value for s in {RUN_RUNNING, *RUN_TERMINAL}), 0)
    by_status.update({status: int(count) for status, count in runs})
    return Gauges(
        queues=tuple(
            TaskQueue(task, int(count), int(oldest if oldest is not None else now_ms))
            for task, count, oldest in sorted(queued)
        ),
        running={task: int(count) for task, count in sorted(running)},
        runs=by_status,
    )


def step_tasks(store: Reads, steps: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The task ref of each (run id, step key) that has a StepRun, by primary key."""
    found: dict[tuple[str, str], str] = {}
    for start in range(0, len(steps), _CHUNK):
        chunk = steps[start : start + _CHUNK]
        where = " OR ".join(["(run_id = ? AND step_key = ?)"] * len(chunk))
        params = [value for step in chunk for value in step]
        sql = f"SELECT run_id, step_key, task_ref FROM step_runs WHERE {where}"
        rows = store.query(sql, params)
        found.update({(run_id, key): task for run_id, key, task in rows})
    return found


_CHUNK = 200  # steps per lookup: 400 parameters, under either database's limit
