"""The host loop behind `qlflow run`, `qlflow worker` and `qlflow serve`.

qlflow itself never runs anything between calls (the host drives it; docs/DESIGN.md,
"The cycle"): this module is one host. Each tick it calls `rt.cycle()` (unless it
is a plain worker), leases claimed Attempts for the local executor up to its free
slots, and runs each on its own thread. Between ticks it waits on an event for
`interval_ms`, woken early when an Attempt finishes (so the next step starts at
once) or when the caller signals (cancel, stop, abort).

Three ways out, each an event the caller sets (from a signal handler, say):
- `cancel`: record the Run's cancel intent (reason user) and keep converging
  until the Run is terminal; running processes learn `stop_requested` at once;
- `stop`: stop leasing, let running Attempts finish for `drain_s` (cycling on, so
  what they finish is settled), then SIGTERM the rest (SIGKILL `kill_after_s`
  later; they are recorded `interrupted` (`worker_shutdown`) and run again on the next
  host — docs/DESIGN.md, "Interruptions"), cycle once
  more and return — a clean shutdown that leaves nothing half-done;
- `abort`: SIGKILL every process now, give their completions a moment to be
  recorded, and return what is left unfinished.

A store that cannot serve a tick (busy, unreachable, disk full) never ends the loop:
the host logs it, waits a capped, growing pause, and goes on; it logs again when the
store answers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from domain.errors import QlflowError, VersionConflict
from domain.intent import cancel_intent
from domain.phases import PHASES
from projections.views import RunView
from qlflow.executor import AttemptReport, RunningProcess
from qlflow.executor.seam import Executor
from qlflow.retention_policy import RetentionPolicy
from qlflow.runtime import CycleResult, Runtime
from qlflow.transient import Backoff, transient_errors
from qlflow.worker_pool import KEPT_REPORTS, WorkerPool

log = logging.getLogger("qlflow.driver")


def _store_failing(backoff: Backoff, why: str) -> float:
    """Log a tick the store could not serve (the first, then every so often) and
    return the pause before the next."""
    pause = backoff.failed()
    if backoff.should_log():
        log.warning(
            "host loop: the store is unavailable (%s); %s, next try in %.1f s",
            why,
            backoff.describe("failed tick", "failed ticks"),
            pause,
        )
    return pause


def _store_trouble(cycle_result: CycleResult) -> str | None:
    """The first Workflow turn of a cycle that failed because the store could not
    serve it (a turn's error is "<run id>: <error type>: <message>"), or None."""
    kinds = tuple(f": {kind.__name__}: " for kind in host_errors())
    for phase in PHASES:
        for error in getattr(getattr(cycle_result, phase, None), "errors", ()):
            if any(kind in error for kind in kinds):
                return f"cycle {phase}: {error}"
    return None


def _store_back(backoff: Backoff) -> None:
    took_s = backoff.failing_for_s
    failures = backoff.succeeded()
    if failures:
        log.warning(
            "host loop: the store answers again after %d failed tick(s) in %.1f s",
            failures,
            took_s,
        )


def host_errors() -> tuple[type[BaseException], ...]:
    """Errors a long-running host outlives: a lost race, a busy or unreachable
    database. Anything else (bad input, a bug) ends the loop."""
    return (VersionConflict, *transient_errors())


DEFAULT_RUN_INTERVAL_MS = 250
DEFAULT_SERVE_INTERVAL_MS = 1000
ABORT_RECORD_S = 1.0
MAX_CONSECUTIVE_FAILURES = 30  # cycles in a row that fail on the driven Run (not the store)
MAX_HOST_PAUSE_S = 30.0  # the longest pause between ticks while the store is unavailable


class CycleFailing(QlflowError):
    """The cycle keeps failing on the Run being driven: it cannot converge."""


@dataclass
class DriveResult:
    """How a drive ended: the Run (when driving one), whether it was aborted, the
    Attempts this host ran, and what was still unfinished on an abort."""

    run: RunView | None = None
    aborted: bool = False
    stopped: bool = False
    reports: list[AttemptReport] = field(default_factory=list)
    left_running: list[RunningProcess] = field(default_factory=list)
    drain: DrainReport | None = None


@dataclass(frozen=True, slots=True)
class DrainReport:
    """How a stop went: Attempts running when it began, how many finished within the
    drain, how many the host then stopped, and how long it all took."""

    running: int
    finished: int
    stopped: int
    took_s: float


class Driver:
    """One host loop: cycles (optional) plus a pool of local workers.

    `until_run`: return once that Run is terminal (and nothing of it still runs).
    `servable`: the task refs this host can run (leases are limited to them).
    `cycles=False`: a plain worker (another process runs the cycles).
    `once`: one lease pass; wait for what was leased, then return.
    """

    def __init__(
        self,
        rt: Runtime,
        executor: Executor,
        *,
        worker_id: str,
        workers: int = 1,
        interval_ms: int = DEFAULT_SERVE_INTERVAL_MS,
        ttl_ms: int = 30_000,
        cycles: bool = True,
        until_run: str | None = None,
        tasks: Iterable[str] | None = None,
        servable: Callable[[], frozenset[str]] | None = None,
        once: bool = False,
        drain_s: float = 10.0,
        on_progress: Callable[[RunView], None] | None = None,
        retention: RetentionPolicy | None = None,
    ) -> None:
        self._rt = rt
        self.retention = retention if retention is not None and retention.active else None
        self.executor = executor
        self.interval_s = interval_ms / 1000
        self.cycles = cycles
        self.until_run = until_run
        self.once = once
        self.drain_s = drain_s
        self._on_progress = on_progress
        self.cancel = threading.Event()
        self.stop = threading.Event()
        self.abort = threading.Event()
        self._wake = threading.Event()
        self.pool = WorkerPool(
            rt,
            executor,
            worker_id=worker_id,
            slots=workers,
            ttl_ms=ttl_ms,
            run_id=until_run,
            tasks=tasks,
            servable=servable,
            on_slot_free=self._wake.set,
        )
        self.pool.next_work = not once  # `once`: the Attempts of one lease, no more
        self._relayed: set[str] = set()
        self._reports: deque[AttemptReport] = deque()  # the drive's, while it runs
        self._cancel_recorded = False

    def request_cancel(self) -> None:
        """Record the Run's cancel intent at the next tick and keep converging."""
        self.cancel.set()
        self._wake.set()

    def request_stop(self) -> None:
        """Stop leasing, drain the running Attempts, and return."""
        self.pool.next_work = False
        self.stop.set()
        self._wake.set()

    def request_abort(self) -> None:
        """Kill every process now and return what is left unfinished."""
        self.pool.next_work = False
        self.abort.set()
        self._wake.set()

    def run(self) -> DriveResult:
        """Loop until the Run is terminal, `once` is done, or stop / abort is set. The
        result's reports: every Attempt of the drive, or, for a host that runs until
        stopped, the newest `KEPT_REPORTS` of them."""
        bounded = self.until_run is not None or self.once
        with self.pool.collecting(None if bounded else KEPT_REPORTS) as self._reports:
            return self._run()

    def _run(self) -> DriveResult:
        result = DriveResult()
        leased_once = False
        cycle_failures = 0
        backoff = Backoff(first_s=self.interval_s, cap_s=max(self.interval_s, MAX_HOST_PAUSE_S))
        while True:
            if self.abort.is_set():
                return self._abort(result)
            if self.stop.is_set():
                return self._shutdown(result, backoff)
            pause = self.interval_s
            try:
                cycle_failures, trouble = self._tick(result, cycle_failures)
                if result.run is not None and result.run.terminal and self.pool.busy == 0:
                    result.reports = list(self._reports)
                    return result
                if not (self.once and leased_once) and not self.stop.is_set():
                    self.pool.fill()
                    leased_once = True
                if trouble is None:
                    _store_back(backoff)
                else:
                    pause = _store_failing(backoff, trouble)
            except host_errors() as error:
                pause = _store_failing(backoff, f"{type(error).__name__}: {error}")
            if self.once and leased_once and self.pool.busy == 0:
                result.reports = list(self._reports)
                return result
            self._wake.wait(pause)
            self._wake.clear()

    def _tick(self, result: DriveResult, cycle_failures: int) -> tuple[int, str | None]:
        """One tick before leasing: the cancel intent if asked, a cycle, the driven
        Run's progress, cancel intents relayed to running processes. Returns the
        count of cycles failing on the driven Run, and why the store failed some
        Workflow turns of this cycle (None: it did not)."""
        if self.until_run and self.cancel.is_set() and not self._cancel_recorded:
            self._rt.cancel(self.until_run, reason="user")
            self._cancel_recorded = True
            log.info("run %s: cancel requested by the user", self.until_run)
        trouble = None
        if self.cycles:
            cycle_result = self._rt.cycle()
            trouble = _store_trouble(cycle_result)
            cycle_failures = self._check_cycle(cycle_result, cycle_failures)
            if self.retention is not None:
                # one bounded batch after the cycle: its time stays flat (DESIGN.md "Retention")
                try:
                    self.retention.tick(self._rt, self._rt.clock_ms())
                except QlflowError as error:  # the next cycle tries again
                    log.warning("retention: %s", error)
        if self.until_run:
            result.run = self._rt.get_run(self.until_run)
            if self._on_progress is not None:
                self._on_progress(result.run)
        self._relay_cancel_intent()
        return cycle_failures, trouble

    def _check_cycle(self, cycle_result: CycleResult, failures: int) -> int:
        """Count consecutive cycles that failed on the driven Run; a Run the cycle
        cannot converge would otherwise be waited on forever."""
        if not self.until_run:
            return 0
        # A Workflow turn the store could not serve is not the Run's fault: only the
        # other errors count towards giving up on it.
        passing = tuple(f"{self.until_run}: {kind.__name__}:" for kind in host_errors())
        errors = [
            error
            for phase in PHASES
            for error in getattr(getattr(cycle_result, phase, None), "errors", ())
            if error.startswith(f"{self.until_run}:") and not error.startswith(passing)
        ]
        if not errors:
            return 0
        failures += 1
        if failures >= MAX_CONSECUTIVE_FAILURES:
            raise CycleFailing(
                f"{failures} cycles in a row failed on run {self.until_run}: {errors[-1]}; "
                f"the Run is left as it is (see qlflow why {self.until_run})"
            )
        return failures

    def _relay_cancel_intent(self) -> None:
        """A Run with cancel intent asks its workers to stop at their next renewal;
        renew this host's Attempts of such a Run now instead of up to ttl/3 later.
        Whether it has intent (recorded, or a passed deadline) the domain decides."""
        now_ms = self._rt.clock_ms()  # leases and deadlines are on the store's clock
        running = {p.run_id for p in self.executor.running()}
        # only the Runs still running here are remembered: `serve` runs for a year
        self._relayed &= running
        for run_id in running - self._relayed:
            view = self._rt.get_run(run_id)
            if view.terminal or cancel_intent(view, now_ms) is not None:
                self._relayed.add(run_id)
                self.executor.renew_now(run_id)

    def _shutdown(self, result: DriveResult, backoff: Backoff) -> DriveResult:
        """Stop leasing; let running Attempts finish for `drain_s` while cycling on;
        then stop the rest (recorded interrupted, `worker_shutdown`) and cycle once more, so a
        restart finds every Attempt this host held ended and recorded."""
        result.stopped = True
        began = time.monotonic()
        running = self.pool.busy
        done_before = self.pool.finished
        deadline = began + self.drain_s
        cycle_failures = 0
        while self.pool.busy and not self.abort.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wake.wait(min(self.interval_s, remaining))
            self._wake.clear()
            try:
                cycle_failures, trouble = self._tick(result, cycle_failures)
                if trouble is None:
                    _store_back(backoff)
                else:
                    _store_failing(backoff, trouble)
            except host_errors() as error:
                _store_failing(backoff, f"{type(error).__name__}: {error}")
        finished = self.pool.finished - done_before
        if self.abort.is_set():
            return self._abort(result)
        stopped = self.pool.busy
        if stopped:
            log.info("shutdown: stopping %d running attempt(s)", stopped)
            self.executor.stop_all("shutdown")
            if not self.pool.join(self.executor.kill_after_s + ABORT_RECORD_S):
                self.executor.kill_all()
                self.pool.join(ABORT_RECORD_S)
        if self.cycles:
            with contextlib.suppress(*host_errors()):
                self._tick(result, 0)  # settle what the drain ended
        result.left_running = self.executor.running()
        self.executor.close()
        result.reports = list(self._reports)
        result.drain = DrainReport(running, finished, stopped, time.monotonic() - began)
        return result

    def _abort(self, result: DriveResult) -> DriveResult:
        result.aborted = True
        result.left_running = self.executor.running()
        self.executor.kill_all()
        self.pool.join(ABORT_RECORD_S)
        result.reports = list(self._reports)
        if self.until_run:
            with contextlib.suppress(QlflowError):
                result.run = self._rt.get_run(self.until_run)
        return result
