"""The `local_process` executor (SPEC §11): one subprocess per leased Attempt.

Per Attempt, in this order:
1. find the Task's command in the Run's published revision and the package folder
   it runs in (`PublishedTasks`), and check the folder still holds the files the
   Task's source digest covers;
2. `mark_starting` — the start barrier, durable before anything is spawned;
3. spawn the command in the package folder, in its own process group, with
   `QLFLOW_RUN_ID`, `QLFLOW_STEP_KEY`, `QLFLOW_ATTEMPT_ID` and the Task's env set,
   stdout and stderr going to one log file per Attempt;
4. `mark_running`, then renew the lease every ttl/3 while the process runs; when a
   renewal answers `stop_requested` (or the host stops the worker) the group gets
   SIGTERM, and SIGKILL once `kill_after_s` has passed;
5. `complete` with exit code 0 -> `succeeded`, anything else -> `failed`, and
   `output = {"log_path", "exit_code", "pid", ...}`.
A command that cannot be found or started completes `failed` with result code
`start_failed` and the error in the output. No process outlives its Attempt: the
group is killed after the leader exits, on loss of the lease, and on `close()`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import eventstore
from domain.errors import FenceError, NotFound, QlflowError
from domain.plan import task_ref
from domain.revision import revision_from_json
from domain.tasks import task_source_digest
from projections import publications
from qlflow.packages import file_digest, load_package

log = logging.getLogger("qlflow.executor")

DEFAULT_KILL_AFTER_S = 5.0
DEFAULT_TTL_MS = 30_000
START_FAILED = "start_failed"
RETRY_S = 1.0  # pause between database retries of a renewal or a completion
PUBLISHED = "publication.published"


class TaskUnavailable(QlflowError):
    """The local executor cannot run an Attempt's Task here (no package folder known
    for it, or the folder no longer holds the published files)."""


@dataclass(frozen=True, slots=True)
class TaskCommand:
    """What to spawn for an Attempt: argv, the Task's own env, and the package folder."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """How one Attempt ended on this executor. `recorded_status` is what `complete`
    recorded (None when the lease was lost and nothing could be recorded)."""

    attempt_id: str
    run_id: str
    step_key: str
    recorded_status: str | None
    exit_code: int | None
    pid: int | None
    log_path: str
    stopped_by: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RunningProcess:
    """A live subprocess of this executor (for "what is left running")."""

    attempt_id: str
    run_id: str
    step_key: str
    pid: int
    started_monotonic: float
    lease_expires_at_ms: int


class PublishedTasks:
    """Resolves a lease to the command of its Task, from the Run's publication.

    The publication holds the revision (commands, env, file lists and source
    digests) but not where the package lives on this host, so the folder comes from
    `folders` (package name -> folder, as given to `run PATH`, `worker
    --package-dir` or `serve --package-dir`), or from a `source_path` the
    publication may record. Before a Task runs, the files it names are hashed again
    and must give its published source digest: a folder that changed since
    publication never runs under the old generation's name.
    """

    def __init__(self, rt, folders: Mapping[str, str | os.PathLike] | None = None) -> None:
        self._rt = rt
        self._folders: dict[str, Path] = {}
        self._revisions: dict[str, tuple[Any, Path | None]] = {}
        self._publication_by_run: dict[str, str] = {}
        self._lock = threading.Lock()
        for package, folder in (folders or {}).items():
            self.add_folder(folder, package)

    def add_folder(self, folder: str | os.PathLike, package: str | None = None) -> str:
        """Serve Tasks of the package in `folder` (its name read from its qlflow.toml
        unless given). Returns the package name."""
        path = Path(folder).resolve()
        if package is None:
            package = load_package(path).manifest.package.name
        with self._lock:
            self._folders[package] = path
        return package

    @property
    def packages(self) -> list[str]:
        """The packages this worker has a folder for."""
        with self._lock:
            return sorted(self._folders)

    def task_refs(self) -> frozenset[str]:
        """The task refs of every published generation of the packages this worker has
        a folder for: lease only these, never a Task it could not start."""
        refs: set[str] = set()
        for package in self.packages:
            for publication in publications.publications(self._rt.store, package):
                revision, _ = self._revision(publication.publication_id)
                refs.update(task_ref(package, revision.generation, t) for t in revision.tasks)
        return frozenset(refs)

    def resolve(self, lease) -> TaskCommand:
        """The command for `lease`'s Task; TaskUnavailable if it cannot run here."""
        publication_id = self._publication_of(lease.run_id)
        revision, recorded_folder = self._revision(publication_id)
        task_id = lease.task_ref.rsplit("#", 1)[-1]
        try:
            task = revision.tasks[task_id]
        except KeyError:
            raise TaskUnavailable(
                f"publication {publication_id} has no Task {task_id!r} (task ref {lease.task_ref})"
            ) from None
        with self._lock:
            folder = self._folders.get(revision.package, recorded_folder)
        if folder is None:
            raise TaskUnavailable(
                f"no package folder known for package {revision.package!r} on this worker; "
                "give it with --package-dir"
            )
        self._check_files(task, folder, revision)
        return TaskCommand(argv=tuple(task.command), env=dict(task.env), cwd=folder)

    def _publication_of(self, run_id: str) -> str:
        with self._lock:
            known = self._publication_by_run.get(run_id)
        if known is None:
            known = self._rt.get_run(run_id).publication_id
            with self._lock:
                self._publication_by_run[run_id] = known
        return known

    def _revision(self, publication_id: str):
        with self._lock:
            cached = self._revisions.get(publication_id)
        if cached is not None:
            return cached
        records = self._rt.store.read_stream(f"publication-{publication_id}")
        published = next((r for r in records if r.type == PUBLISHED), None)
        if published is None:
            raise NotFound(f"publication {publication_id!r} has no published revision")
        revision = revision_from_json(published.data["revision"])
        source = published.data.get("source_path")
        entry = (revision, Path(source) if isinstance(source, str) and source else None)
        with self._lock:
            self._revisions[publication_id] = entry
        return entry

    @staticmethod
    def _check_files(task, folder: Path, revision) -> None:
        if not folder.is_dir():
            raise TaskUnavailable(f"package folder {str(folder)!r} does not exist")
        digests = {}
        for relative in task.files:
            try:
                digests[relative] = file_digest(folder / relative)
            except OSError as error:
                raise TaskUnavailable(
                    f"Task {task.task_id!r}: cannot read {relative!r} in {str(folder)!r}: "
                    f"{error.strerror}"
                ) from None
        if task_source_digest(task.definition(), digests) != task.source_digest:
            raise TaskUnavailable(
                f"Task {task.task_id!r}: the files in {str(folder)!r} changed since "
                f"{revision.package} generation {revision.generation} was published; "
                "publish again and start a new Run"
            )


@dataclass
class _Supervised:
    lease: Any
    process: subprocess.Popen
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
        rt,
        resolve: Callable[[Any], TaskCommand],
        *,
        log_dir: str | os.PathLike,
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
            _signal_group(item.process, signal.SIGKILL)
            item.wake.set()

    def close(self) -> None:
        """Kill whatever is still running. Idempotent."""
        self._closed = True
        self.kill_all()

    def _items(self, run_id: str | None) -> list[_Supervised]:
        with self._lock:
            return [s for s in self._supervised.values() if run_id in (None, s.lease.run_id)]

    # -- one Attempt ----------------------------------------------------------
    def execute(self, lease) -> AttemptReport:
        """Run one leased Attempt to its end and record the outcome under the lease."""
        log_path = self._log_path(lease)
        try:
            command: TaskCommand | None = self._resolve(lease)
            problem = None
        except (QlflowError, OSError) as error:
            command, problem = None, str(error)
        try:
            lease = self._rt.mark_starting(lease)
        except FenceError as error:
            log.warning("attempt %s: lease lost before start: %s", lease.attempt_id, error)
            return _report(lease, None, None, None, log_path, error=str(error))
        if command is None:
            return self._start_failed(lease, log_path, problem or "task unavailable")
        if self._closed:
            return self._start_failed(lease, log_path, "the executor is shutting down")
        try:
            process = self._spawn(lease, command, log_path)
        except OSError as error:
            reason = f"cannot start {command.argv[0]!r}: {error.strerror or error}"
            _append_log(log_path, f"qlflow: {reason}\n")
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
            _signal_group(process, signal.SIGKILL)  # on any way out, nothing survives
            with self._lock:
                self._supervised.pop(lease.attempt_id, None)

    def _spawn(self, lease, command: TaskCommand, log_path: Path) -> subprocess.Popen:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(command.env)
        env.update(
            QLFLOW_RUN_ID=lease.run_id,
            QLFLOW_STEP_KEY=lease.step_key,
            QLFLOW_ATTEMPT_ID=lease.attempt_id,
        )
        with open(log_path, "ab") as sink:
            process = subprocess.Popen(
                list(command.argv),
                cwd=command.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_DIE_WITH_PARENT,
            )
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
        lease = item.lease
        try:
            item.lease = lease = self._rt.mark_running(lease)
        except FenceError as error:
            return self._abandon(item, f"lease lost before running: {error}")
        except QlflowError as error:
            log.warning("attempt %s: mark_running failed: %s", lease.attempt_id, error)
        interval_s = self.ttl_ms / 3000
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
                except (QlflowError, *transient_errors()) as error:
                    if _wall_ms() >= lease.expires_at_ms:
                        return self._abandon(item, f"lease expired, renewal failing: {error}")
                    log.warning("attempt %s: renewal failed: %s", lease.attempt_id, error)
                    next_renew = time.monotonic() + min(interval_s, RETRY_S)
            if item.stop_reason is not None and item.term_sent_at is None:
                log.info("attempt %s: SIGTERM (%s)", lease.attempt_id, item.stop_reason)
                _signal_group(item.process, signal.SIGTERM)
                item.term_sent_at = time.monotonic()
            if (
                item.term_sent_at is not None
                and not item.killed
                and time.monotonic() >= item.term_sent_at + self.kill_after_s
            ):
                log.info("attempt %s: SIGKILL after %.1fs", lease.attempt_id, self.kill_after_s)
                _signal_group(item.process, signal.SIGKILL)
                item.killed = True
        _signal_group(item.process, signal.SIGKILL)  # whatever the leader left behind
        exit_code = item.process.returncode
        output: dict[str, Any] = {
            "log_path": str(item.log_path),
            "exit_code": exit_code,
            "pid": item.process.pid,
        }
        if exit_code is not None and exit_code < 0:
            output["signal"] = signal.Signals(-exit_code).name
        if item.stop_reason is not None:
            output["stopped_by"] = item.stop_reason
        outcome = "succeeded" if exit_code == 0 else "failed"
        try:
            status = self._complete(lease, outcome, output)
        except QlflowError as error:
            log.warning("attempt %s: completion not recorded: %s", lease.attempt_id, error)
            return _report(
                lease,
                None,
                exit_code,
                item.process.pid,
                item.log_path,
                stopped_by=item.stop_reason,
                error=str(error),
            )
        return _report(
            lease, status, exit_code, item.process.pid, item.log_path, stopped_by=item.stop_reason
        )

    def _complete(self, lease, outcome: str, output: dict[str, Any]) -> str:
        """Record the outcome; retry a busy or unreachable database while the lease
        lives (a completion is idempotent: a retry after a lost answer is a replay)."""
        while True:
            try:
                return self._rt.complete(lease, outcome, output=output)
            except transient_errors() as error:
                if _wall_ms() + RETRY_S * 1000 >= lease.expires_at_ms:
                    raise
                log.warning("attempt %s: completion failed, retrying: %s", lease.attempt_id, error)
                time.sleep(RETRY_S)  # a back-off between database attempts, not a test wait

    def _abandon(self, item: _Supervised, reason: str) -> AttemptReport:
        """The lease is gone: nothing this worker writes would be accepted, and the
        process must not run on unowned. Kill it and let recovery record the loss."""
        log.warning(
            "attempt %s: %s; killing pid %d", item.lease.attempt_id, reason, item.process.pid
        )
        _signal_group(item.process, signal.SIGKILL)
        item.exited.wait()
        return _report(
            item.lease,
            None,
            item.process.returncode,
            item.process.pid,
            item.log_path,
            stopped_by="lease_lost",
            error=reason,
        )

    def _start_failed(self, lease, log_path: Path, reason: str) -> AttemptReport:
        log.warning("attempt %s: start failed: %s", lease.attempt_id, reason)
        output = {"log_path": str(log_path), "exit_code": None, "error": reason}
        try:
            status = self._rt.complete(lease, "failed", result_code=START_FAILED, output=output)
        except QlflowError as error:
            return _report(lease, None, None, None, log_path, error=f"{reason}; {error}")
        return _report(lease, status, None, None, log_path, error=reason)

    def _log_path(self, lease) -> Path:
        run_folder = lease.run_id.replace(":", "_")
        attempt = lease.attempt_id.replace(":", "_")
        return self.log_dir / run_folder / f"{lease.step_key}-{attempt}.log"


def _report(lease, status, exit_code, pid, log_path, *, stopped_by=None, error=None):
    return AttemptReport(
        lease.attempt_id,
        lease.run_id,
        lease.step_key,
        status,
        exit_code,
        pid,
        str(log_path),
        stopped_by,
        error,
    )


def _parent_death_signal():
    """On Linux, a function for the child (between fork and exec) that asks the
    kernel to SIGKILL it when the thread that spawned it dies — so even a worker
    killed with SIGKILL, which runs no cleanup, leaves no step process behind.
    None elsewhere. The C function is looked up here, in the parent: the child
    only makes one system call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def die_with_parent() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return die_with_parent


_DIE_WITH_PARENT = _parent_death_signal()


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors worth another try: a busy or unreachable database (the store says which)."""
    return eventstore.transient_errors()


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _renew_after(lease, interval_s: float) -> float:
    """Seconds until the next renewal: every ttl/3, and sooner if the lease we hold
    expires earlier than that (a replayed renewal answers with its own expiry)."""
    remaining_s = (lease.expires_at_ms - _wall_ms()) / 1000
    return max(0.0, min(interval_s, remaining_s / 3))


def _wait_for_exit(item: _Supervised) -> None:
    item.process.wait()
    item.exited.set()
    item.wake.set()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    # The child leads its own session, so its pid is the group id; signalling the
    # group reaches whatever it spawned too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _append_log(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as sink:
            sink.write(text)


def _kill_at_exit(ref: weakref.ref) -> None:
    executor = ref()
    if executor is not None:
        executor.kill_all()


def pids_alive(pids: Iterable[int]) -> list[int]:
    """The pids of `pids` that still name a live (non-zombie) process."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            alive.append(pid)
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                if stat.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    continue
        except OSError:
            pass
        alive.append(pid)
    return alive
