"""The pool processes of a host: started once (multiprocessing's `forkserver`: no
interpreter start per step), each running one python step at a time, replaced
when one is ended (docs/DESIGN.md, "Python tasks")."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import types
from multiprocessing.connection import wait
from typing import Any

from qlflow.python.call import FAILED, PROCESS_DIED, Call, Outcome
from qlflow.python.context import LogSink

_CONTEXT_LOCK = threading.Lock()
_context: Any = None


def _mp_context() -> Any:
    """The forkserver context, its server preloaded with the call machinery, so a new
    pool process forks from an interpreter that has it imported already."""
    global _context
    with _CONTEXT_LOCK:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["qlflow.python.child"])
            _context = context
        return _context


_MAIN_LOCK = threading.Lock()


def _start_without_main(process: Any) -> None:
    """Start `process` without it re-running the host's `__main__`: a pool process runs
    package code only, and a host script without an `if __name__ == "__main__"` guard
    would otherwise run again in every pool process. The preparation data is built
    from `sys.modules["__main__"]` as `start` runs, so a bare module stands in."""
    with _MAIN_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            process.start()
        finally:
            if main is not None:
                sys.modules["__main__"] = main


class PoolProcess:
    """One pool process and its pipe. `start(call)`, then `wait(timeout, sink)` until
    it answers an Outcome; `request_stop()` asks the function to stop, `kill()`
    ends the process (the pool replaces it)."""

    def __init__(self) -> None:
        from qlflow.python.child import serve

        context = _mp_context()
        self._conn, child_conn = context.Pipe(duplex=True)
        self._stop = context.Event()
        self.process = context.Process(
            target=serve, args=(child_conn, self._stop), name="qlflow-python", daemon=True
        )
        _start_without_main(self.process)
        child_conn.close()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.dead = False

    @property
    def pid(self) -> int:
        """The process id (for "what is left running")."""
        return self.process.pid or 0

    def start(self, call: Call) -> None:
        """Hand the process one call."""
        self._stop.clear()
        self._drain_wake()
        self._conn.send(call)

    def wait(self, timeout_s: float, sink: LogSink) -> Outcome | None:
        """Pass log lines to `sink` for up to `timeout_s` (or until `wake()`); the call's
        Outcome once it has one (`process_died` when the process ended), else None."""
        ready = wait([self._conn, self.process.sentinel, self._wake_r], max(0.0, timeout_s))
        if self._conn in ready or self.process.sentinel in ready:
            while True:
                try:
                    if not self._conn.poll():
                        break
                    message = self._conn.recv()
                except (EOFError, OSError):
                    break
                if message[0] == "log":
                    sink(message[1], message[2])
                elif message[0] == "done":
                    return message[1]  # type: ignore[no-any-return]
            if self.process.sentinel in ready or not self.process.is_alive():
                self.process.join(1.0)
                self.dead = True
                return Outcome(FAILED, PROCESS_DIED, message=self._died())
        if self._wake_r in ready:
            self._drain_wake()
        return None

    def wake(self) -> None:
        """Make a `wait` in progress return now."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def request_stop(self) -> None:
        """Make the function's `stop_requested()` true."""
        self._stop.set()

    def kill(self) -> None:
        """SIGKILL the process (a later `wait` answers `process_died`)."""
        self.dead = True
        with contextlib.suppress(OSError, ValueError):
            self.process.kill()

    def close(self) -> None:
        """End the process and free its pipes."""
        self.kill()
        with contextlib.suppress(OSError, ValueError):
            self.process.join(1.0)
        for closing in (
            self._conn.close,
            lambda: os.close(self._wake_r),
            lambda: os.close(self._wake_w),
        ):
            with contextlib.suppress(OSError):
                closing()

    def _died(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"the pool process ended by {signal.Signals(-code).name}"
        return f"the pool process exited with code {code}"

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.set_blocking(self._wake_r, False)
            while os.read(self._wake_r, 64):
                pass


class ProcessPool:
    """Up to `size` pool processes, started as they are first needed and kept."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._idle: list[PoolProcess] = []
        self._count = 0
        self._lock = threading.Condition()
        self._closed = False

    def acquire(self) -> PoolProcess:
        """A free pool process (a new one while fewer than `size` run; else wait)."""
        with self._lock:
            while True:
                if self._closed:
                    raise RuntimeError("the process pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._count < self.size:
                    self._count += 1
                    break
                self._lock.wait()
        try:
            return PoolProcess()
        except BaseException:
            with self._lock:
                self._count -= 1
                self._lock.notify()
            raise

    def release(self, process: PoolProcess) -> None:
        """Give a process back (a dead one is closed, and replaced when next needed)."""
        with self._lock:
            if process.dead or self._closed:
                self._count -= 1
                process.close()
            else:
                self._idle.append(process)
            self._lock.notify()

    def start(self, count: int | None = None) -> None:
        """Start processes ahead of the first step (all `size` of them by default)."""
        started = [self.acquire() for _ in range(min(self.size, count or self.size))]
        for process in started:
            self.release(process)

    def close(self) -> None:
        """End every idle process; busy ones end as they are released."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._lock.notify_all()
        for process in idle:
            process.close()
