"""Testing a package's Workflows in milliseconds (docs/DESIGN.md, "Python tasks").

    # conftest.py
    pytest_plugins = ["qlflow.testing"]

    # test_etl.py
    from qlflow.testing import VirtualClock, run_to_end

    def test_the_retry_waits_ten_minutes(qlflow_runtime):
        clock = VirtualClock()
        run = run_to_end(qlflow_runtime, "path/to/package", "daily", clock=clock)
        assert run.status == "succeeded"

`qlflow_runtime` is a runtime on a fresh SQLite file of the test's own.
`run_to_end` publishes the package folder, starts the Workflow and drives it on a
virtual clock: a cycle, a lease of what is claimable, each python Task's function
called in this process, and — when nothing is left to do now — the clock moved to
the next instant something is due (a retry's backoff ending, the Workflow's
deadline, a lease expiring), as the domain's windows say. A retry 10 minutes away
costs no waiting. `run_schedules` does the same for a package's schedules: the clock
jumps from one occurrence to the next (a week of a nightly across a DST change is a
few milliseconds), and each Run fired is driven to its end. Command Tasks need a host
(`qlflow run`): they are refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from domain.errors import QlflowError
from domain.work import grant_work, next_opening, phase_work
from eventstore.logs import Piece
from projections.views import RunView
from qlflow.clock import wall_clock_ms
from qlflow.executor.tasks import PublishedTasks, TaskUnavailable
from qlflow.python.call import FAILED, invoke
from qlflow.python.executor import call_for
from qlflow.runtime import Lease, Runtime

WORKER_ID = "qlflow-testing"
LEASE_TTL_MS = 60_000
MAX_ROUNDS = 10_000


class VirtualClock:
    """A clock that only moves when told to (epoch milliseconds)."""

    def __init__(self, now_ms: int | None = None) -> None:
        self.now_ms = wall_clock_ms() if now_ms is None else now_ms

    def advance(self, ms: int) -> int:
        """Move on by `ms`; returns the new instant."""
        self.now_ms += ms
        return self.now_ms

    def advance_to(self, instant_ms: int) -> int:
        """Move on to `instant_ms` (never back)."""
        self.now_ms = max(self.now_ms, instant_ms)
        return self.now_ms


class Stuck(QlflowError):
    """The Run is not terminal and nothing is due at any later instant."""


class NotInProcess(QlflowError):
    """A Task `run_to_end` cannot run in this process (a command Task)."""


def run_to_end(
    rt: Runtime,
    package: str | os.PathLike[str],
    workflow: str,
    *,
    params: Mapping[str, Any] | None = None,
    clock: VirtualClock | None = None,
    timeout_ms: int | None = None,
    max_rounds: int = MAX_ROUNDS,
) -> RunView:
    """Publish the package folder `package`, start `workflow` and drive its Run to its
    end on `clock` (a new VirtualClock by default); returns the terminal Run."""
    clock = clock or VirtualClock()
    folder = Path(package).resolve()
    publication = rt.publish(folder, now_ms=clock.now_ms)
    tasks = PublishedTasks(rt, {publication.package: folder})
    receipt = rt.start(
        publication.package, workflow, params=params, timeout_ms=timeout_ms, now_ms=clock.now_ms
    )
    return drive(rt, receipt.run_id, tasks, clock, max_rounds=max_rounds)


def run_schedules(
    rt: Runtime,
    package: str | os.PathLike[str],
    *,
    until_ms: int,
    clock: VirtualClock | None = None,
    max_runs: int = 1_000,
) -> list[RunView]:
    """Publish the package folder `package` and let its schedules fire on `clock` until
    `until_ms`: the clock jumps to each next occurrence, a cycle admits it as a host's
    would (misfire and the start guard apply), and every Run fired is driven to its
    end before the clock moves on. Returns the fired Runs in the order they fired."""
    clock = clock or VirtualClock()
    folder = Path(package).resolve()
    publication = rt.publish(folder, now_ms=clock.now_ms)
    tasks = PublishedTasks(rt, {publication.package: folder})
    fired: list[RunView] = []
    seen: set[str] = set()
    for _ in range(MAX_ROUNDS):
        rt.cycle(now_ms=clock.now_ms)  # arms what was published, admits what is due
        ours = [s for s in rt.schedules() if s.package == publication.package]
        for run_id in sorted({s.last_run_id for s in ours if s.last_run_id} - seen):
            seen.add(run_id)
            fired.append(drive(rt, run_id, tasks, clock))
            if len(fired) >= max_runs:
                return fired
        upcoming = [s.next_fire_at_ms for s in ours if s.next_fire_at_ms is not None]
        next_fire = min(upcoming, default=None)
        if next_fire is None or next_fire > until_ms:
            return fired
        clock.advance_to(next_fire)
    raise Stuck(f"the schedules of {publication.package} did not reach {until_ms}")


def drive(
    rt: Runtime,
    run_id: str,
    tasks: PublishedTasks,
    clock: VirtualClock,
    *,
    max_rounds: int = MAX_ROUNDS,
) -> RunView:
    """Drive an admitted Run to its end on `clock` (see the module docstring)."""
    for _ in range(max_rounds):
        rt.cycle(now_ms=clock.now_ms)
        leases = rt.lease_attempts(
            WORKER_ID, limit=64, ttl_ms=LEASE_TTL_MS, now_ms=clock.now_ms, run_id=run_id,
            start=True,
        )  # fmt: skip
        for lease in leases:
            _run_here(rt, tasks, lease, clock.now_ms)
        view = rt.get_run(run_id)
        if view.terminal:
            return view
        if leases:
            continue
        due = next_due(rt, run_id, clock.now_ms)
        if due is None:
            raise Stuck(
                f"run {run_id} is {view.status} and nothing is due after {clock.now_ms} "
                f"(see rt.why({run_id!r}))"
            )
        clock.advance_to(due)
    raise Stuck(f"run {run_id} did not end within {max_rounds} rounds")


def next_due(rt: Runtime, run_id: str, now_ms: int) -> int | None:
    """The first instant after `now_ms` at which a cycle phase or a lease grant has
    work on the Run (the domain's windows: docs/DESIGN.md, "The candidate index")."""
    aggregate = rt.aggregate_at(run_id)
    work_sets = [*phase_work(aggregate).values(), *grant_work(aggregate).values()]
    later = [next_opening(work, now_ms) for work in work_sets]
    return min((at for at in later if at is not None), default=None)


def _run_here(rt: Runtime, tasks: PublishedTasks, lease: Lease, now_ms: int) -> None:
    try:
        command = tasks.resolve(lease)
    except TaskUnavailable as error:
        rt.complete(lease, FAILED, result_code=error.result_code or "start_failed", now_ms=now_ms)
        return
    if command.python is None:
        raise NotInProcess(
            f"step {lease.step_key!r} runs a command ({' '.join(command.argv)}); run_to_end "
            "calls python Tasks in this process only — drive it with `qlflow run`"
        )
    pieces: list[Piece] = []
    outcome = invoke(
        call_for(rt, lease, command),
        lambda stream, data: pieces.append((stream, now_ms, data)),
        lambda: False,
    )
    if pieces:
        rt.append_log(lease.attempt_id, pieces)
    rt.complete(
        lease,
        outcome.outcome,
        result_code=outcome.result_code,
        output=outcome.output,
        now_ms=now_ms,
    )


try:
    import pytest
except ImportError:  # pragma: no cover - qlflow.testing is used under pytest
    pass
else:

    @pytest.fixture
    def qlflow_runtime(tmp_path: Path) -> Iterator[Runtime]:
        """A runtime on a fresh SQLite store in the test's temporary folder."""
        from qlflow.runtime import Runtime

        runtime = Runtime(f"sqlite:///{tmp_path / 'qlflow-test.db'}")
        try:
            yield runtime
        finally:
            runtime.close()
