"""The python executor: runs leased Attempts of python Tasks under their leases
(docs/DESIGN.md, "Python tasks").

Per Attempt, as the command executor does: find the Task and check the package
folder still holds the files its source digest covers (`PublishedTasks.resolve`:
else `source_changed`-style refusal, nothing run); pass the start barrier; run
the function — in a pool process (`isolation = "process"`, the default) or on a
thread of this host (`"thread"`); renew the lease every ttl/3 while it runs,
relaying `stop_requested` to the function's context; and complete with what it
returned. A pool process asked to stop is ended `kill_after_s` later; a thread
can only be asked. The Attempt is marked running once the function has run for
`RUNNING_AFTER_S` (a function that returns at once costs no commit for it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from domain.errors import FenceError, QlflowError
from domain.execution import MAX_TEXT
from domain.python_tasks import ISOLATION_THREAD, parse_target
from domain.tasks import ON_INTERRUPT_DEFAULT
from domain.transitions import WORKER_SHUTDOWN, Status
from projections.task_io import attempt_inputs
from qlflow.executor.capture import LogCapture
from qlflow.executor.local import (
    DEFAULT_KILL_AFTER_S,
    DEFAULT_TTL_MS,
    HOST_STOPS,
    INTERRUPTED,
    START_FAILED,
)
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
)
from qlflow.executor.tasks import TaskCommand, TaskUnavailable
from qlflow.executor.writes import Held
from qlflow.python.call import PROCESS_DIED, Call, Outcome, invoke
from qlflow.python.context import LogSink
from qlflow.python.pool import PoolProcess, ProcessPool
from qlflow.runtime import Lease, Runtime
from qlflow.transient import transient_errors

log = logging.getLogger("qlflow.executor")

RUNNING_AFTER_S = 0.5
DEFAULT_PROCESSES = 64  # the most pool processes; they start as steps need them


class _Handle(Protocol):
    pid: int
    can_kill: bool

    def wait(self, timeout_s: float, sink: LogSink) -> Outcome | None: ...
    def request_stop(self) -> None: ...
    def kill(self) -> None: ...
    def wake(self) -> None: ...


class _ProcessHandle:
    can_kill = True

    def __init__(self, process: PoolProcess, call: Call) -> None:
        self.process = process
        self.pid = process.pid
        process.start(call)

    def wait(self, timeout_s: float, sink: LogSink) -> Outcome | None:
        return self.process.wait(timeout_s, sink)

    def request_stop(self) -> None:
        self.process.request_stop()

    def kill(self) -> None:
        self.process.kill()
        self.process.wake()

    def wake(self) -> None:
        self.process.wake()


class _ThreadHandle:
    """The function on a daemon thread of this host: it can be asked to stop, never
    made to (docs/DESIGN.md, "Python tasks")."""

    can_kill = False

    def __init__(self, call: Call, sink: LogSink) -> None:
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._event = threading.Event()
        self._outcome: Outcome | None = None
        self._thread = threading.Thread(
            target=self._run, args=(call, sink), name=f"python-{call.step_key}", daemon=True
        )
        self._thread.start()

    def _run(self, call: Call, sink: LogSink) -> None:
        self._outcome = invoke(call, sink, self._stop.is_set)
        self._event.set()

    def wait(self, timeout_s: float, sink: LogSink) -> Outcome | None:
        self._event.wait(max(0.0, timeout_s))
        self._event.clear()
        return self._outcome

    def request_stop(self) -> None:
        self._stop.set()

    def kill(self) -> None:  # a thread cannot be ended
        self._stop.set()

    def wake(self) -> None:
        self._event.set()


class _AttemptLog:
    """The Attempt's log, opened on its first line (most functions write none)."""

    def __init__(self, rt: Runtime, attempt_id: str, log_path: Path) -> None:
        self._rt = rt
        self._attempt_id = attempt_id
        self.path = log_path
        self._capture: LogCapture | None = None
        self._lock = threading.Lock()

    def write(self, stream: str, data: bytes) -> None:
        with self._lock:
            if self._capture is None:
                self._capture = LogCapture(self._rt, self._attempt_id, self.path)
                self._capture.start_flushing()
            capture = self._capture
        capture.write(stream, data)

    def note(self, text: str) -> None:
        self.write("qlflow", (text.rstrip("\n") + "\n").encode("utf-8", "replace"))

    def close(self) -> None:
        with self._lock:
            capture, self._capture = self._capture, None
        if capture is not None:
            capture.close()


@dataclass
class _Running(Held):
    handle: _Handle
    attempt_log: _AttemptLog
    started_monotonic: float
    renew_now: bool = False
    stop_reason: str | None = None
    stop_asked_at: float | None = None
    killed: bool = False
    abandoned: bool = False
    on_interrupt: str = ON_INTERRUPT_DEFAULT  # the Task's: what a stop by this host does


class PythonExecutor:
    """Runs leased Attempts of python Tasks; thread-safe (one thread per Attempt, as
    `WorkerPool` calls it). `resolve(lease) -> TaskCommand` is usually
    `PublishedTasks.resolve`; `processes` caps the pool processes of this host."""

    def __init__(
        self,
        rt: Runtime,
        resolve: Callable[[Lease], TaskCommand],
        *,
        log_dir: str | os.PathLike[str],
        ttl_ms: int = DEFAULT_TTL_MS,
        kill_after_s: float = DEFAULT_KILL_AFTER_S,
        processes: int = DEFAULT_PROCESSES,
    ) -> None:
        self._rt = rt
        self._resolve = resolve
        self.log_dir = Path(log_dir)
        self.ttl_ms = ttl_ms
        self.kill_after_s = kill_after_s
        self.completer: Completer | None = None  # how outcomes are recorded (a host's pool)
        self.pool = ProcessPool(processes)
        self._held: HeldAttempts[_Running] = HeldAttempts(lambda item: item.handle.wake())
        self._closing = threading.Event()

    # -- control from other threads ------------------------------------------
    def running(self) -> list[RunningProcess]:
        """The python steps running right now (a thread's pid is this host's)."""
        items = self._held.select()
        return [
            RunningProcess(
                i.lease.attempt_id,
                i.lease.run_id,
                i.lease.step_key,
                i.handle.pid,
                i.started_monotonic,
                i.lease.expires_at_ms,
            )
            for i in items
        ]

    def renew_now(self, run_id: str | None = None) -> None:
        """Renew the leases now, so a new cancel intent reaches the functions at once."""
        self._held.renew_now(run_id)

    def stop_all(self, reason: str = "shutdown") -> None:
        """Ask every function to stop; pool processes are ended `kill_after_s` later."""
        self._held.stop_all(reason)

    def kill_all(self) -> None:
        """End every pool process now; a thread is given up (its lease lapses)."""
        for item in self._held.select():
            if item.stop_reason is None:
                item.stop_reason = "killed"
            if item.handle.can_kill:
                item.killed = True
                item.handle.kill()
            else:
                item.abandoned = True
            item.handle.wake()

    def close(self) -> None:
        """Kill whatever still runs and end the pool processes. Idempotent."""
        self._closing.set()
        self.kill_all()
        self.pool.close()

    # -- one Attempt ----------------------------------------------------------
    def execute(self, lease: Lease) -> AttemptReport:
        """Run one leased Attempt of a python Task to its end and record its outcome."""
        log_path = attempt_log_path(self.log_dir, lease)
        attempt_log = _AttemptLog(self._rt, lease.attempt_id, log_path)
        try:
            return self._execute(lease, attempt_log)
        finally:
            attempt_log.close()

    def _execute(self, lease: Lease, attempt_log: _AttemptLog) -> AttemptReport:
        log_path = attempt_log.path
        command: TaskCommand | None = None
        call: Call | None = None
        problem, code = None, START_FAILED
        try:
            command = self._resolve(lease)
            if command.python is None:
                raise TaskUnavailable(f"task ref {lease.task_ref} is not a python Task")
        except TaskUnavailable as error:
            if error.cancelled and not lease.started:
                return not_started(lease, log_path, str(error))
            problem, code = str(error), error.result_code or START_FAILED
            if error.cancelled:
                code = WORKER_SHUTDOWN
            command = None
        except (QlflowError, OSError) as error:
            problem, command = str(error), None
        if command is not None:
            try:
                call = call_for(self._rt, lease, command)
            except transient_errors():
                return not_started(lease, log_path, "the store cannot be read right now")
            except QlflowError as error:
                problem = str(error)
        if self._closing.is_set() and not lease.started:
            return not_started(lease, log_path, "the executor is shutting down")
        held = Held(lease)
        refused = cross_start_barrier(
            self._rt, held, log_path, ttl_ms=self.ttl_ms, stopping=self._closing
        )
        if refused is not None:
            return refused
        if call is None or command is None:
            return self._failed_to_start(held, attempt_log, problem or "task unavailable", code)
        if self._closing.is_set():  # past the barrier: recorded, never run
            return self._failed_to_start(held, attempt_log, "the host stopped", WORKER_SHUTDOWN)
        handle = self._start(call, command, attempt_log)
        item = _Running(
            held.lease, handle, attempt_log, time.monotonic(), on_interrupt=command.on_interrupt
        )
        self._held.add(item)
        try:
            return self._supervise(item)
        finally:
            self._held.remove(lease.attempt_id)
            if isinstance(handle, _ProcessHandle):
                self.pool.release(handle.process)

    def _start(self, call: Call, command: TaskCommand, attempt_log: _AttemptLog) -> _Handle:
        if command.isolation == ISOLATION_THREAD:
            return _ThreadHandle(call, attempt_log.write)
        return _ProcessHandle(self.pool.acquire(), call)

    def _supervise(self, item: _Running) -> AttemptReport:
        interval_s = self.ttl_ms / 3000
        transient = transient_errors()
        running_at: float | None = time.monotonic() + RUNNING_AFTER_S
        keeper = LeaseKeeper(self._rt, self.ttl_ms, item.lease)
        while True:
            now = time.monotonic()
            waits = [keeper.wait_s(item, now)]
            if running_at is not None:
                waits.append(running_at - now)
            if item.stop_asked_at is not None and item.handle.can_kill and not item.killed:
                waits.append(item.stop_asked_at + self.kill_after_s - now)
            if item.stop_reason is not None and item.stop_asked_at is None:
                waits = [0.0]
            outcome = item.handle.wait(max(0.0, min(waits)), item.attempt_log.write)
            if outcome is not None:
                return self._finish(item, outcome)
            if item.abandoned:
                return self._abandon(item, "the host left; a thread cannot be ended")
            now = time.monotonic()
            if running_at is not None and now >= running_at:
                try:
                    item.lease = self._rt.mark_running(item.lease)
                    running_at = None
                except FenceError as error:
                    return self._abandon(item, f"lease lost before running: {error}")
                except transient:
                    running_at = now + interval_s
                except QlflowError as error:
                    log.warning("attempt %s: mark_running: %s", item.lease.attempt_id, error)
                    running_at = None
            lost = keeper.tick(item, now)
            if lost is not None:
                return self._abandon(item, lost)
            if item.stop_reason is not None and item.stop_asked_at is None:
                item.attempt_log.note(f"qlflow: asked to stop ({item.stop_reason})")
                item.handle.request_stop()
                item.stop_asked_at = time.monotonic()
            if (
                item.stop_asked_at is not None
                and item.handle.can_kill
                and not item.killed
                and time.monotonic() >= item.stop_asked_at + self.kill_after_s
            ):
                item.attempt_log.note(
                    f"qlflow: still running {self.kill_after_s:.1f}s after the stop: "
                    "ending its pool process"
                )
                item.killed = True
                item.handle.kill()

    def _finish(self, item: _Running, outcome: Outcome) -> AttemptReport:
        result_code, recorded = outcome.result_code, outcome.outcome
        if outcome.result_code == PROCESS_DIED:
            if outcome.message:
                item.attempt_log.note(f"qlflow: {outcome.message}")
            if item.killed and item.stop_reason in HOST_STOPS:
                # the host stopped it: it did not fail by itself, and runs again unless
                # its Task says a stop is a failure (as a command's stop)
                result_code = WORKER_SHUTDOWN
                if item.on_interrupt == ON_INTERRUPT_DEFAULT:
                    recorded = INTERRUPTED
            elif item.killed:
                result_code = None  # ended on the Run's stop: recorded as the Run says
        output = outcome.output
        if item.stop_reason == STEP_TIMEOUT and item.stop_asked_at is not None:
            # stopped at its step's timeout: recorded timed_out (step_timeout) however
            # the function ended, with no output
            recorded, result_code, output = Status.TIMED_OUT, None, None
        execution = {
            "pid": item.handle.pid,
            "log_path": str(item.attempt_log.path),
            "stopped_by": item.stop_reason,
            "error": _cut(outcome.message) if recorded != Status.SUCCEEDED else None,
        }
        status, error = complete_held(
            self._rt,
            item,
            recorded,
            result_code,
            output,
            execution,
            ttl_ms=self.ttl_ms,
            completer=self.completer,
        )
        return report(
            item.lease,
            status,
            None,
            item.handle.pid,
            item.attempt_log.path,
            stopped_by=item.stop_reason,
            error=error or (outcome.message if outcome.outcome != Status.SUCCEEDED else None),
        )

    def _failed_to_start(
        self, held: Held, attempt_log: _AttemptLog, reason: str, result_code: str
    ) -> AttemptReport:
        log.warning("attempt %s: not run (%s): %s", held.lease.attempt_id, result_code, reason)
        attempt_log.note(f"qlflow: {reason}")
        # stopped by this host before it ran anything: interrupted, it runs again
        outcome = INTERRUPTED if result_code == WORKER_SHUTDOWN else Status.FAILED
        execution = {"log_path": str(attempt_log.path), "error": _cut(reason)}
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
        return report(
            held.lease,
            status,
            None,
            None,
            attempt_log.path,
            error=reason if error is None else f"{reason}; {error}",
        )

    def _abandon(self, item: _Running, reason: str) -> AttemptReport:
        """Nothing this worker writes for the Attempt would be accepted (or the host is
        leaving): end its pool process and let recovery record the loss."""
        log.warning("attempt %s: %s", item.lease.attempt_id, reason)
        if item.handle.can_kill:
            item.handle.kill()
        return report(
            item.lease,
            None,
            None,
            item.handle.pid,
            item.attempt_log.path,
            stopped_by="lease_lost" if item.stop_reason is None else item.stop_reason,
            error=reason,
        )


def call_for(rt: Runtime, lease: Lease, command: TaskCommand) -> Call:
    """The Call of a leased Attempt of a python Task (`command` from `resolve`): its
    function, and its context's data (`Runtime._run_holding`: the Run as this process
    left it, or as the read models hold it)."""
    assert command.python is not None and command.source_digest is not None
    target = parse_target(command.python)
    facts = attempt_inputs(rt._run_holding(lease), lease.step_key, lease.attempt_id)
    return Call(
        folder=str(command.cwd),
        module=target.module,
        function=target.function,
        source_digest=command.source_digest,
        params=dict(facts.inputs["params"]),
        needs=dict(facts.inputs["needs"]),
        run_id=lease.run_id,
        step_key=lease.step_key,
        attempt=facts.attempt,
        max_attempts=facts.max_attempts,
        attempt_id=lease.attempt_id,
    )


def _cut(text: str | None) -> str | None:
    """A message as an Attempt's execution record holds it (the log has all of it)."""
    return None if text is None or len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
