"""The main of a pool process: take a Call, run it, send back its log and Outcome.

A pool process ignores SIGINT (the host drains on it, and asks its steps to stop
through `stop_requested`), ends when the host process ends, and sends what the
function prints as log lines of stdout and stderr."""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection, wait
from typing import Any

from qlflow.python.call import Call, invoke

ORPHANED_EXIT = 70  # the host process went away


class _Sender:
    """Sends (kind, ...) messages to the host; from any thread of the function."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._conn.send(message)

    def log(self, stream: str, data: bytes) -> None:
        self.send(("log", stream, data))


class _StreamToLog(io.RawIOBase):
    def __init__(self, sender: _Sender, stream: str) -> None:
        self._sender = sender
        self._stream = stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        if chunk:
            self._sender.log(self._stream, chunk)
        return len(chunk)


def serve(conn: Connection, stop: Any) -> None:
    """Run Calls from `conn` until it closes; `stop` is the host's stop event."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(
            target=_exit_with, args=(parent.sentinel,), name="qlflow-orphan", daemon=True
        ).start()
    sender = _Sender(conn)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(_StreamToLog(sender, "stdout")), encoding="utf-8", line_buffering=True
    )
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(_StreamToLog(sender, "stderr")), encoding="utf-8", line_buffering=True
    )
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            return
        if not isinstance(call, Call):
            return
        outcome = invoke(call, sender.log, stop.is_set)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sender.send(("done", outcome))


def _exit_with(sentinel: int) -> None:
    wait([sentinel])
    os._exit(ORPHANED_EXIT)
