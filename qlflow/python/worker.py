"""`qlflow.Worker`: what an embedding host uses to run Tasks itself — lease the
Attempts of the packages it has folders for, run them (python Tasks in its pool
processes or threads, commands as subprocesses) and complete them. The same
executors `qlflow serve`, `worker` and `run` use."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from qlflow.executor.local import DEFAULT_KILL_AFTER_S, DEFAULT_TTL_MS, LocalProcessExecutor
from qlflow.executor.reports import AttemptReport
from qlflow.executor.tasks import PublishedTasks
from qlflow.python.executor import PythonExecutor
from qlflow.python.routing import TaskRouter
from qlflow.runtime import Runtime
from qlflow.worker_pool import KEPT_REPORTS, WorkerPool

DEFAULT_LOG_DIR = ".qlflow-logs"


class Worker:
    """Leases, runs and completes Attempts on `rt`, at most `slots` at once.

    `packages`: package folders (their names read from their qlflow.toml) or a
    mapping of package name to folder; only their Tasks are leased. Use it as a
    context manager, or call `close()`: it ends the pool processes."""

    def __init__(
        self,
        rt: Runtime,
        packages: Iterable[str | os.PathLike[str]] | Mapping[str, str | os.PathLike[str]] = (),
        *,
        worker_id: str | None = None,
        slots: int = 4,
        ttl_ms: int = DEFAULT_TTL_MS,
        kill_after_s: float = DEFAULT_KILL_AFTER_S,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.rt = rt
        self.tasks = PublishedTasks(rt, packages if isinstance(packages, Mapping) else None)
        if not isinstance(packages, Mapping):
            for folder in packages:
                self.tasks.add_folder(folder)
        folder = Path(log_dir) if log_dir is not None else Path.cwd() / DEFAULT_LOG_DIR
        self.executor = TaskRouter(
            self.tasks,
            LocalProcessExecutor(
                rt, self.tasks.resolve, log_dir=folder, ttl_ms=ttl_ms, kill_after_s=kill_after_s
            ),
            PythonExecutor(
                rt,
                self.tasks.resolve,
                log_dir=folder,
                ttl_ms=ttl_ms,
                kill_after_s=kill_after_s,
                processes=slots,
            ),
        )
        self._wake = threading.Event()
        self.pool = WorkerPool(
            rt,
            self.executor,
            worker_id=worker_id or f"{socket.gethostname()[:80]}-{os.getpid()}",
            slots=slots,
            ttl_ms=ttl_ms,
            servable=self.tasks.task_refs,
            on_slot_free=self._wake.set,
        )
        self._pool_lock = threading.Lock()

    def add_package(self, folder: str | os.PathLike[str]) -> str:
        """Serve the Tasks of one more package folder; returns its package name."""
        name = self.tasks.add_folder(folder)
        self.pool.forget_servable()
        return name

    def run_once(
        self, run_id: str | None = None, timeout_s: float | None = None
    ) -> list[AttemptReport]:
        """Lease up to the free slots (of one Run, or any), run them, wait for them
        (at most `timeout_s`) and return how each ended."""
        with self._pool_lock, self.pool.collecting() as reports:
            self.pool.run_id = run_id
            self.pool.next_work = False  # the Attempts of this one lease
            self.pool.fill()
            self.pool.join(timeout_s)
            return list(reports)

    def work(
        self,
        until: Callable[[], bool],
        *,
        cycle: bool = False,
        interval_s: float = 0.1,
    ) -> list[AttemptReport]:
        """Lease and run until `until()` is true (checked every `interval_s` and when an
        Attempt's end leaves a slot free). `cycle=True` also calls `rt.cycle()` every
        `interval_s` (a host with no other process cycling). Returns the Attempts it
        ran (the newest `KEPT_REPORTS` of them, for a call that runs more)."""
        with self._pool_lock, self.pool.collecting(KEPT_REPORTS) as reports:
            self.pool.run_id = None
            self.pool.next_work = True  # a completion takes what it made ready
            next_cycle = 0.0
            while not until():
                # a completion commits what the cycle would decide next from it (its
                # dependents claimed), so a step's end needs no cycle before the next
                # lease: the cycle runs every interval_s for the rest
                if cycle and time.monotonic() >= next_cycle:
                    self.rt.cycle()
                    next_cycle = time.monotonic() + interval_s
                self.pool.fill()
                self._wake.wait(interval_s)
                self._wake.clear()
            self.pool.next_work = False  # done: what runs ends, nothing new starts
            self.pool.join()
            return list(reports)

    async def arun_once(
        self, run_id: str | None = None, timeout_s: float | None = None
    ) -> list[AttemptReport]:
        """`run_once` without blocking the event loop."""
        return await asyncio.to_thread(self.run_once, run_id, timeout_s)

    async def awork(
        self, until: Callable[[], bool], *, cycle: bool = False, interval_s: float = 0.1
    ) -> list[AttemptReport]:
        """`work` without blocking the event loop."""
        return await asyncio.to_thread(self.work, until, cycle=cycle, interval_s=interval_s)

    def stop(self, grace_s: float | None = None) -> None:
        """Ask every running step to stop and wait `grace_s` (default: the kill grace)
        for them; pool processes still running are then ended."""
        self.pool.next_work = False
        self.executor.stop_all("shutdown")
        deadline = time.monotonic() + (
            grace_s if grace_s is not None else self.executor.kill_after_s
        )
        self.pool.join(max(0.0, deadline - time.monotonic()) + 1.0)

    def close(self) -> None:
        """End whatever still runs and the pool processes. Idempotent."""
        self.executor.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
