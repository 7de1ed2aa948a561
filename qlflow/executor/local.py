"""The `local_process` executor: one subprocess per leased Attempt, supervised under
its lease until it ends, and its outcome recorded."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from domain.errors import FenceError, QlflowError
from domain.tasks import ON_INTERRUPT_DEFAULT
from domain.transitions import WORKER_SHUTDOWN, Status
from projections.task_io import TaskInputs
from qlflow.executor.capture import LogCapture, note_to_log
from qlflow.executor.processes import signal_group, signal_name, spawn
from qlflow.executor.reports import AttemptReport, RunningProcess, report
from qlflow.executor.seam import Completer
from qlflow.executor.step_deadline import STEP_TIMEOUT
from qlflow.executor.supervision import (
    HeldAttempts,
    LeaseKeeper,
    attempt_log_path,
    complete_held,
    cross_start_barrier,
    not_started,
    run_log_folder,
)
from qlflow.executor.task_io import OUTPUT_INVALID, OutputInvalid, read_output, task_environment
from qlflow.executor.tasks import TaskCommand, TaskUnavailable
from qlflow.executor.writes import Held, NotStarted, recovered, retrying, until_recorded
from qlflow.runtime import Lease, Runtime
from qlflow.trace_context import TRACEPARENT_ENV, traceparent
from qlflow.transient import Backoff, transient_errors

log = logging.getLogger("qlflow.executor")
T = TypeVar("T")

DEFAULT_KILL_AFTER_S = 5.0
DEFAULT_TTL_MS = 30_000
START_FAILED = "start_failed"
INTERRUPTED = Status.INTERRUPTED  # the outcome of a step its host stopped: it runs again
HOST_STOPS = ("shutdown", "killed")  # stop reasons that are the host's, not the Run's


@dataclass
class _Supervised(Held):
    process: subprocess.Popen[bytes]
    log_path: Path
    started_monotonic: float
    wake: threading.Event = field(default_factory=threading.Event)
    exited: threading.Event = field(default_factory=threading.Event)
    renew_now: bool = False
    stop_reason: str | None = None
    term_sent_at: float | None = None
    killed: bool = False
    capture: LogCapture | None = None  # its output, to the log file and the store
    on_interrupt: str = ON_INTERRUPT_DEFAULT  # the Task's: what a stop by this host does


class LocalProcessExecutor:
    """Runs leased Attempts as local subprocesses; thread-safe (one thread per Attempt).

    `resolve(lease) -> TaskCommand` finds what to run (usually `PublishedTasks.resolve`).
    `ttl_ms` must be the TTL the leases were granted with; renewals use it too.

    The store may be unavailable for a while (busy, unreachable, disk full): every
    worker write is then retried with a capped backoff while the lease keeps being
    renewed, and a spawned process is never stopped for it. Only a FenceError — the
    lease is really gone — ends this worker's claim on its Attempt.
    """

    def __init__(
        self,
        rt: Runtime,
        resolve: Callable[[Lease], TaskCommand],
        *,
        log_dir: str | os.PathLike[str],
        ttl_ms: int = DEFAULT_TTL_MS,
        kill_after_s: float = DEFAULT_KILL_AFTER_S,
    ) -> None:
        self._rt = rt
        self._resolve = resolve
        self.log_dir = Path(log_dir)
        self.ttl_ms = ttl_ms
        self.kill_after_s = kill_after_s
        self.completer: Completer | None = None  # how outcomes are recorded (a host's pool)
        self._held: HeldAttempts[_Supervised] = HeldAttempts(lambda item: item.wake.set())
        self._closing = threading.Event()
        atexit.register(_kill_at_exit, weakref.ref(self))

    @property
    def _closed(self) -> bool:
        return self._closing.is_set()

    # -- control from other threads ------------------------------------------
    def running(self) -> list[RunningProcess]:
        """The subprocesses alive right now."""
        items = self._held.select()
        return [
            RunningProcess(
                s.lease.attempt_id,
                s.lease.run_id,
                s.lease.step_key,
                s.process.pid,
                s.started_monotonic,
                s.lease.expires_at_ms,
            )
            for s in items
            if not s.exited.is_set()
        ]

    def renew_now(self, run_id: str | None = None) -> None:
        """Renew the leases now (of one Run, or all) instead of waiting for ttl/3, so a
        new cancel intent reaches the processes at once as `stop_requested`."""
        self._held.renew_now(run_id)

    def stop_all(self, reason: str = "shutdown") -> None:
        """SIGTERM every process group now; SIGKILL follows after `kill_after_s`."""
        self._held.stop_all(reason)

    def kill_all(self) -> None:
        """SIGKILL every process group at once (the host is leaving without waiting)."""
        for item in self._held.select():
            if item.stop_reason is None:
                item.stop_reason = "killed"
            item.killed = True
            signal_group(item.process, signal.SIGKILL)
            item.wake.set()

    def close(self) -> None:
        """Kill whatever is still running. Idempotent."""
        self._closing.set()
        self.kill_all()

    # -- one Attempt ----------------------------------------------------------
    def execute(self, lease: Lease) -> AttemptReport:
        """Run one leased Attempt to its end and record the outcome under the lease:
        find its command, pass the start barrier (`mark_starting`, unless the lease was
        granted with it: `lease_attempts(start=True)`) before spawning,
        then supervise the process under its lease and `complete` with its exit code
        (0 -> succeeded, anything else -> failed)."""
        log_path = attempt_log_path(self.log_dir, lease)
        command: TaskCommand | None = None
        inputs: TaskInputs = {"params": {}, "needs": {}}
        problem, code = None, START_FAILED
        held = Held(lease)
        try:  # what a store that cannot answer now keeps from us is asked for again
            command = self._read(held, "task lookup", self._resolve)
        except (FenceError, NotStarted) as error:
            return not_started(held.lease, log_path, f"lease lost or host stopping: {error}")
        except TaskUnavailable as error:
            if error.cancelled and not lease.started:
                return not_started(lease, log_path, str(error))
            problem, code = str(error), error.result_code or START_FAILED
            if error.cancelled:  # past the barrier already: recorded, never run
                code = WORKER_SHUTDOWN
        except (QlflowError, OSError) as error:
            problem = str(error)
        if command is not None:
            try:
                inputs = self._read(held, "task inputs", self._rt.task_inputs)
            except (FenceError, NotStarted) as error:
                return not_started(held.lease, log_path, f"lease lost or stopping: {error}")
            except QlflowError as error:
                command, problem = None, str(error)
        if self._closed and not lease.started:
            return not_started(lease, log_path, "the executor is shutting down")
        refused = cross_start_barrier(
            self._rt, held, log_path, ttl_ms=self.ttl_ms, stopping=self._closing
        )
        if refused is not None:
            return refused
        if command is None:
            return self._start_failed(held, log_path, problem or "task unavailable", code)
        if self._closing.is_set() or self._closed:  # past the barrier, never run: again later
            return self._start_failed(held, log_path, "the host stopped", WORKER_SHUTDOWN)
        try:
            process = self._spawn(held.lease, command, inputs, log_path)
        except OSError as error:
            reason = f"cannot start {command.argv[0]!r}: {error.strerror or error}"
            note_to_log(self._rt, held.lease.attempt_id, log_path, f"qlflow: {reason}")
            return self._start_failed(held, log_path, reason, START_FAILED)
        capture = LogCapture(self._rt, held.lease.attempt_id, log_path)
        capture.start(process)
        item = _Supervised(
            held.lease,
            process,
            log_path,
            time.monotonic(),
            capture=capture,
            on_interrupt=command.on_interrupt,
        )
        self._held.add(item)
        threading.Thread(
            target=_wait_for_exit, args=(item,), name=f"wait-{process.pid}", daemon=True
        ).start()
        try:
            return self._supervise(item)
        finally:
            signal_group(process, signal.SIGKILL)  # on any way out, nothing survives
            capture.close()
            self._held.remove(lease.attempt_id)

    def _read(self, held: Held, what: str, read: Callable[[Lease], T]) -> T:
        """`read(lease)` until the store answers, the lease renewed meanwhile; a lease
        that really ended is a FenceError, a host that stops (before the start
        barrier) NotStarted."""
        return until_recorded(
            self._rt,
            held,
            what,
            read,
            ttl_ms=self.ttl_ms,
            stopping=self._closing,
            unfenced=True,
        )

    def _spawn(
        self, lease: Lease, command: TaskCommand, inputs: TaskInputs, log_path: Path
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update(command.env)
        env.update(
            QLFLOW_RUN_ID=lease.run_id,
            QLFLOW_STEP_KEY=lease.step_key,
            QLFLOW_ATTEMPT_ID=lease.attempt_id,
        )
        # the Run's trace (qlflow/trace_context.py): its spans join the trace qlflow's
        # spans of this Run are in, whichever host makes them
        env[TRACEPARENT_ENV] = traceparent(lease.run_id, lease.attempt_id)
        env.update(task_environment(inputs, *_io_paths(log_path)))
        process = spawn(command.argv, command.cwd, env)
        log.info(
            "attempt %s (%s/%s): pid %d: %s",
            lease.attempt_id,
            lease.run_id,
            lease.step_key,
            process.pid,
            " ".join(command.argv),
        )
        return process

    def _supervise(self, item: _Supervised) -> AttemptReport:
        """While the process runs: record it running, renew the lease every ttl/3, and
        on `stop_requested`, past the step's timeout (`step_timed_out`, asked at its
        deadline: `step_deadline`) or on a stop of the host, SIGTERM the group,
        SIGKILL it `kill_after_s` later. A write the store cannot take now is tried
        again with a capped backoff; the process runs on meanwhile."""
        transient = transient_errors()
        running_recorded = False
        running_backoff = Backoff()
        next_running = time.monotonic()
        keeper = LeaseKeeper(self._rt, self.ttl_ms, item.lease)
        while True:
            now = time.monotonic()
            if not running_recorded and not item.exited.is_set() and now >= next_running:
                try:
                    item.lease = self._rt.mark_running(item.lease)
                    running_recorded = True
                    recovered(running_backoff, item.lease, Status.RUNNING)
                except FenceError as error:
                    return self._abandon(item, f"lease lost before running: {error}")
                except transient as error:
                    next_running = now + running_backoff.failed()
                    retrying(running_backoff, item.lease, Status.RUNNING, error)
                except QlflowError as error:
                    log.warning("attempt %s: mark_running failed: %s", item.lease.attempt_id, error)
                    running_recorded = True
            if item.exited.is_set():
                break
            lost = keeper.tick(item, now)
            if lost is not None:
                return self._abandon(item, lost)
            if item.stop_reason is not None and item.term_sent_at is None:
                log.info("attempt %s: SIGTERM (%s)", item.lease.attempt_id, item.stop_reason)
                signal_group(item.process, signal.SIGTERM)
                item.term_sent_at = time.monotonic()
            if (
                item.term_sent_at is not None
                and not item.killed
                and time.monotonic() >= item.term_sent_at + self.kill_after_s
            ):
                log.info(
                    "attempt %s: SIGKILL after %.1fs", item.lease.attempt_id, self.kill_after_s
                )
                signal_group(item.process, signal.SIGKILL)
                item.killed = True
            now = time.monotonic()
            waits = [keeper.wait_s(item, now)]
            if not running_recorded:
                waits.append(next_running - now)
            if item.term_sent_at is not None and not item.killed:
                waits.append(item.term_sent_at + self.kill_after_s - now)
            item.wake.wait(max(0.0, min(waits)))
            item.wake.clear()
        signal_group(item.process, signal.SIGKILL)  # whatever the leader left behind
        return self._finish(item)

    def _finish(self, item: _Supervised) -> AttemptReport:
        """Record the exited process's outcome under its lease (its log stored first)."""
        exit_code = item.process.returncode
        if item.capture is not None:
            self._store_log(item, item.capture)
        execution: dict[str, Any] = {
            "exit_code": exit_code,
            "pid": item.process.pid,
            "log_path": str(item.log_path),
            "signal": signal_name(exit_code),
            "stopped_by": item.stop_reason,
        }
        outcome = Status.SUCCEEDED if exit_code == 0 else Status.FAILED
        # A step the host stopped (drain over, host leaving) did not fail by itself: it
        # is interrupted and runs again, unless its Task says a stop is a failure.
        stopped_by_host = item.stop_reason in HOST_STOPS and item.term_sent_at is not None
        code = WORKER_SHUTDOWN if outcome == Status.FAILED and stopped_by_host else None
        if code is not None and item.on_interrupt == ON_INTERRUPT_DEFAULT:
            outcome = INTERRUPTED
        written: dict[str, Any] | None = None
        if item.stop_reason == STEP_TIMEOUT and item.term_sent_at is not None:
            # stopped at its step's timeout: recorded timed_out (step_timeout) however
            # it exited, and what it may have half written is no output
            outcome, code = Status.TIMED_OUT, None
        else:
            try:  # what the task wrote to QLFLOW_OUTPUT is its output, and nothing else is
                written = read_output(_io_paths(item.log_path)[1])
            except OutputInvalid as problem:
                execution["error"] = str(problem)
                outcome, code, written = Status.FAILED, OUTPUT_INVALID, None
        status, error = complete_held(
            self._rt,
            item,
            outcome,
            code,
            written,
            execution,
            ttl_ms=self.ttl_ms,
            completer=self.completer,
        )
        return report(
            item.lease,
            status,
            exit_code,
            item.process.pid,
            item.log_path,
            stopped_by=item.stop_reason,
            error=error,
        )

    def _store_log(self, held: Held, capture: LogCapture) -> None:
        """The last of the log before the completion (a Run seen ended has its last
        lines), tried again while the store cannot take it and the lease lives on."""
        capture.finish()
        if not capture.pending:
            return
        try:
            until_recorded(
                self._rt, held, "log", lambda _lease: capture.send(), ttl_ms=self.ttl_ms,
                unfenced=True,
            )  # fmt: skip
        except QlflowError as error:  # the lease ended: the completion will say so
            log.warning("attempt %s: log not stored: %s", held.lease.attempt_id, error)

    def _abandon(self, item: _Supervised, reason: str) -> AttemptReport:
        """The lease is gone: nothing this worker writes would be accepted, and the
        process must not run on unowned. Kill it and let recovery record the loss."""
        log.warning(
            "attempt %s: %s; killing pid %d", item.lease.attempt_id, reason, item.process.pid
        )
        signal_group(item.process, signal.SIGKILL)
        item.exited.wait()
        if item.capture is not None:
            item.capture.finish()
        return report(
            item.lease,
            None,
            item.process.returncode,
            item.process.pid,
            item.log_path,
            stopped_by="lease_lost",
            error=reason,
        )

    def _start_failed(
        self, held: Held, log_path: Path, reason: str, result_code: str
    ) -> AttemptReport:
        """The Task cannot be found or started: complete `failed` with `result_code` —
        or, stopped by this host before it spawned anything, `interrupted`."""
        log.warning("attempt %s: start failed (%s): %s", held.lease.attempt_id, result_code, reason)
        execution = {"log_path": str(log_path), "exit_code": None, "error": reason}
        outcome = INTERRUPTED if result_code == WORKER_SHUTDOWN else Status.FAILED
        status, error = complete_held(
            self._rt,
            held,
            outcome,
            result_code,
            None,
            execution,
            ttl_ms=self.ttl_ms,
            completer=self.completer,
        )
        if status is None:
            return report(held.lease, None, None, None, log_path, error=f"{reason}; {error}")
        return report(held.lease, status, None, None, log_path, error=reason)


def remove_local_logs(log_dir: Path, run_ids: Iterable[str]) -> int:
    """Delete the local log folder of each Run (retention removed them); how many
    there were."""
    removed = 0
    for run_id in run_ids:
        path = run_log_folder(log_dir, run_id)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def _io_paths(log_path: Path) -> tuple[Path, Path]:
    """(QLFLOW_INPUTS, QLFLOW_OUTPUT) of an Attempt: beside its log."""
    stem = log_path.with_suffix("")
    return stem.with_name(stem.name + ".inputs.json"), stem.with_name(stem.name + ".output.json")


def _wait_for_exit(item: _Supervised) -> None:
    item.process.wait()
    item.exited.set()
    item.wake.set()


def _kill_at_exit(ref: weakref.ref[LocalProcessExecutor]) -> None:
    executor = ref()
    if executor is not None:
        executor.kill_all()
