"""The `local_process` executor: one subprocess per leased Attempt, supervised under
its lease until it ends, and its outcome recorded."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from domain.errors import FenceError, QlflowError
from qlflow.clock import wall_clock_ms
from qlflow.executor.processes import append_log, signal_group, signal_name, spawn
from qlflow.executor.reports import AttemptReport, RunningProcess, report
from qlflow.executor.tasks import TaskCommand
from qlflow.runtime import Lease, Runtime
from qlflow.transient import transient_errors

log = logging.getLogger("qlflow.executor")

DEFAULT_KILL_AFTER_S = 5.0
DEFAULT_TTL_MS = 30_000
START_FAILED = "start_failed"
RETRY_S = 1.0  # pause between database retries of a renewal or a completion


@dataclass
class _Supervised:
    lease: Lease
    process: subprocess.Popen[bytes]
    log_path: Path
    started_monotonic: float
    wake: threading.Event = field(default_factory=threading.Event)
    exited: threading.Event = field(default_factory=threading.Event)
    renew_now: bool = False
    stop_reason: str | None = None
    term_sent_at: float | None = None
    killed: bool = False


class LocalProcessExecutor:
    """Runs leased Attempts as local subprocesses; thread-safe (one thread per Attempt).

    `resolve(lease) -> TaskCommand` finds what to run (usually `PublishedTasks.resolve`).
    `ttl_ms` must be the TTL the leases were granted with; renewals use it too.
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
        self._supervised: dict[str, _Supervised] = {}
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(_kill_at_exit, weakref.ref(self))

    # -- control from other threads ------------------------------------------
    def running(self) -> list[RunningProcess]:
        """The subprocesses alive right now."""
        with self._lock:
            items = list(self._supervised.values())
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
        for item in self._items(run_id):
            item.renew_now = True
            item.wake.set()

    def stop_all(self, reason: str = "shutdown") -> None:
        """SIGTERM every process group now; SIGKILL follows after `kill_after_s`."""
        for item in self._items(None):
            if item.stop_reason is None:
                item.stop_reason = reason
            item.wake.set()

    def kill_all(self) -> None:
        """SIGKILL every process group at once (the host is leaving without waiting)."""
        for item in self._items(None):
            if item.stop_reason is None:
                item.stop_reason = "killed"
            item.killed = True
            signal_group(item.process, signal.SIGKILL)
            item.wake.set()

    def close(self) -> None:
        """Kill whatever is still running. Idempotent."""
        self._closed = True
        self.kill_all()

    def _items(self, run_id: str | None) -> list[_Supervised]:
        with self._lock:
            return [s for s in self._supervised.values() if run_id in (None, s.lease.run_id)]

    # -- one Attempt ----------------------------------------------------------
    def execute(self, lease: Lease) -> AttemptReport:
        """Run one leased Attempt to its end and record the outcome under the lease:
        find its command, pass the start barrier (`mark_starting`) before spawning,
        then supervise the process under its lease and `complete` with its exit code
        (0 -> succeeded, anything else -> failed)."""
        log_path = self._log_path(lease)
        command: TaskCommand | None = None
        problem = None
        try:
            command = self._resolve(lease)
        except (QlflowError, OSError) as error:
            problem = str(error)
        try:
            lease = self._rt.mark_starting(lease)
        except FenceError as error:
            log.warning("attempt %s: lease lost before start: %s", lease.attempt_id, error)
            return report(lease, None, None, None, log_path, error=str(error))
        if command is None:
            return self._start_failed(lease, log_path, problem or "task unavailable")
        if self._closed:
            return self._start_failed(lease, log_path, "the executor is shutting down")
        try:
            process = self._spawn(lease, command, log_path)
        except OSError as error:
            reason = f"cannot start {command.argv[0]!r}: {error.strerror or error}"
            append_log(log_path, f"qlflow: {reason}\n")
            return self._start_failed(lease, log_path, reason)
        item = _Supervised(lease, process, log_path, time.monotonic())
        with self._lock:
            self._supervised[lease.attempt_id] = item
        threading.Thread(
            target=_wait_for_exit, args=(item,), name=f"wait-{process.pid}", daemon=True
        ).start()
        try:
            return self._supervise(item)
        finally:
            signal_group(process, signal.SIGKILL)  # on any way out, nothing survives
            with self._lock:
                self._supervised.pop(lease.attempt_id, None)

    def _spawn(self, lease: Lease, command: TaskCommand, log_path: Path) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update(command.env)
        env.update(
            QLFLOW_RUN_ID=lease.run_id,
            QLFLOW_STEP_KEY=lease.step_key,
            QLFLOW_ATTEMPT_ID=lease.attempt_id,
        )
        process = spawn(command.argv, command.cwd, env, log_path)
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
        """Renew the lease every ttl/3 while the process runs; on `stop_requested`
        (or a stop of the host) SIGTERM the group, SIGKILL it `kill_after_s` later."""
        lease = item.lease
        try:
            item.lease = lease = self._rt.mark_running(lease)
        except FenceError as error:
            return self._abandon(item, f"lease lost before running: {error}")
        except QlflowError as error:
            log.warning("attempt %s: mark_running failed: %s", lease.attempt_id, error)
        interval_s = self.ttl_ms / 3000
        retryable: tuple[type[BaseException], ...] = (QlflowError, *transient_errors())
        next_renew = time.monotonic() + _renew_after(lease, interval_s)
        while not item.exited.is_set():
            now = time.monotonic()
            waits = [next_renew - now]
            if item.term_sent_at is not None and not item.killed:
                waits.append(item.term_sent_at + self.kill_after_s - now)
            item.wake.wait(max(0.0, min(waits)))
            item.wake.clear()
            if item.exited.is_set():
                break
            now = time.monotonic()
            if item.renew_now or now >= next_renew:
                item.renew_now = False
                try:
                    item.lease = lease = self._rt.renew(lease, ttl_ms=self.ttl_ms)
                    next_renew = time.monotonic() + _renew_after(lease, interval_s)
                    if lease.stop_requested and item.stop_reason is None:
                        item.stop_reason = "stop_requested"
                except FenceError as error:
                    return self._abandon(item, f"lease lost while running: {error}")
                except retryable as error:
                    if wall_clock_ms() >= lease.expires_at_ms:
                        return self._abandon(item, f"lease expired, renewal failing: {error}")
                    log.warning("attempt %s: renewal failed: %s", lease.attempt_id, error)
                    next_renew = time.monotonic() + min(interval_s, RETRY_S)
            if item.stop_reason is not None and item.term_sent_at is None:
                log.info("attempt %s: SIGTERM (%s)", lease.attempt_id, item.stop_reason)
                signal_group(item.process, signal.SIGTERM)
                item.term_sent_at = time.monotonic()
            if (
                item.term_sent_at is not None
                and not item.killed
                and time.monotonic() >= item.term_sent_at + self.kill_after_s
            ):
                log.info("attempt %s: SIGKILL after %.1fs", lease.attempt_id, self.kill_after_s)
                signal_group(item.process, signal.SIGKILL)
                item.killed = True
        signal_group(item.process, signal.SIGKILL)  # whatever the leader left behind
        return self._finish(item, lease)

    def _finish(self, item: _Supervised, lease: Lease) -> AttemptReport:
        """Record the exited process's outcome under `lease`."""
        exit_code = item.process.returncode
        output: dict[str, Any] = {
            "log_path": str(item.log_path),
            "exit_code": exit_code,
            "pid": item.process.pid,
        }
        ended_by = signal_name(exit_code)
        if ended_by is not None:
            output["signal"] = ended_by
        if item.stop_reason is not None:
            output["stopped_by"] = item.stop_reason
        outcome = "succeeded" if exit_code == 0 else "failed"
        try:
            status = self._complete(lease, outcome, output)
        except QlflowError as error:
            log.warning("attempt %s: completion not recorded: %s", lease.attempt_id, error)
            return report(
                lease,
                None,
                exit_code,
                item.process.pid,
                item.log_path,
                stopped_by=item.stop_reason,
                error=str(error),
            )
        return report(
            lease, status, exit_code, item.process.pid, item.log_path, stopped_by=item.stop_reason
        )

    def _complete(self, lease: Lease, outcome: str, output: dict[str, Any]) -> str:
        """Record the outcome; retry a busy or unreachable database while the lease
        lives (a completion is idempotent: a retry after a lost answer is a replay)."""
        while True:
            try:
                return self._rt.complete(lease, outcome, output=output)
            except transient_errors() as error:
                if wall_clock_ms() + RETRY_S * 1000 >= lease.expires_at_ms:
                    raise
                log.warning("attempt %s: completion failed, retrying: %s", lease.attempt_id, error)
                time.sleep(RETRY_S)  # a back-off between database attempts, not a test wait

    def _abandon(self, item: _Supervised, reason: str) -> AttemptReport:
        """The lease is gone: nothing this worker writes would be accepted, and the
        process must not run on unowned. Kill it and let recovery record the loss."""
        log.warning(
            "attempt %s: %s; killing pid %d", item.lease.attempt_id, reason, item.process.pid
        )
        signal_group(item.process, signal.SIGKILL)
        item.exited.wait()
        return report(
            item.lease,
            None,
            item.process.returncode,
            item.process.pid,
            item.log_path,
            stopped_by="lease_lost",
            error=reason,
        )

    def _start_failed(self, lease: Lease, log_path: Path, reason: str) -> AttemptReport:
        """The Task cannot be found or started: complete `failed` with `start_failed`."""
        log.warning("attempt %s: start failed: %s", lease.attempt_id, reason)
        output = {"log_path": str(log_path), "exit_code": None, "error": reason}
        try:
            status = self._rt.complete(lease, "failed", result_code=START_FAILED, output=output)
        except QlflowError as error:
            return report(lease, None, None, None, log_path, error=f"{reason}; {error}")
        return report(lease, status, None, None, log_path, error=reason)

    def _log_path(self, lease: Lease) -> Path:
        run_folder = lease.run_id.replace(":", "_")
        attempt = lease.attempt_id.replace(":", "_")
        return self.log_dir / run_folder / f"{lease.step_key}-{attempt}.log"


def _renew_after(lease: Lease, interval_s: float) -> float:
    """Seconds until the next renewal: every ttl/3, and sooner if the lease we hold
    expires earlier than that (a replayed renewal answers with its own expiry)."""
    remaining_s = (lease.expires_at_ms - wall_clock_ms()) / 1000
    return max(0.0, min(interval_s, remaining_s / 3))


def _wait_for_exit(item: _Supervised) -> None:
    item.process.wait()
    item.exited.set()
    item.wake.set()


def _kill_at_exit(ref: weakref.ref[LocalProcessExecutor]) -> None:
    executor = ref()
    if executor is not None:
        executor.kill_all()
