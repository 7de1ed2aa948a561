"""A step process's output, captured: read from its stdout and stderr pipes, copied
whole to the Attempt's log file on this host, and sent to the store (where anyone
can read it with `qlflow logs`) about once a second and at the end.

The store keeps a capped log per Attempt (`eventstore.logs`: head and tail); the
file keeps everything, uncapped, for the host's own operator and for when the store
could not be reached. A burst is sent as soon as a quarter MiB (or half the cap)
waits; while the store cannot be reached (or keep up), what waits is bounded too:
its first and last parts; the store's marker counts what was left out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from domain.errors import QlflowError
from eventstore.logs import NOTE, STDERR, STDOUT, Piece
from qlflow.clock import wall_clock_ms
from qlflow.runtime import Runtime
from qlflow.transient import transient_errors

log = logging.getLogger("qlflow.executor")

FLUSH_INTERVAL_S = 1.0
READ_BYTES = 64 * 1024
DRAIN_TIMEOUT_S = 5.0  # how long the end waits for the pipes to close
FINAL_TRIES = 3  # the last flush retries a busy or unreachable store this often
_MERGE_BYTES = 16 * 1024  # consecutive reads of one stream are sent as one piece up to this
SEND_SOON_BYTES = 256 * 1024  # this much waiting is sent at once, not at the next second


class LogCapture:
    """Captures one Attempt's output (see the module docstring). `start(process)` once
    the process runs; `finish()` when it has exited."""

    def __init__(
        self,
        rt: Runtime,
        attempt_id: str,
        log_path: Path,
        *,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self._rt = rt
        self.attempt_id = attempt_id
        self.log_path = log_path
        self._interval_s = flush_interval_s
        # send early once this much waits; past `_limit` (the store is unreachable or
        # slower than the process) keep only the two ends of what waits
        self._soon = max(1, min(rt.log_cap_bytes // 2, SEND_SOON_BYTES))
        self._limit = max(2, 4 * rt.log_cap_bytes)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: list[Piece] = []
        self._pending_bytes = 0
        self._left_out = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._readers: list[threading.Thread] = []
        self._flusher: threading.Thread | None = None
        self._closed = False
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] | None = open(log_path, "ab")  # noqa: SIM115 (closed in finish)

    def start(self, process: subprocess.Popen[bytes]) -> None:
        """Read the process's pipes (one thread for both, so lines of the two streams
        stay in the order they were read) and send to the store every
        `flush_interval_s`."""
        pipes = {STDOUT: process.stdout, STDERR: process.stderr}
        reader = threading.Thread(target=self._read, args=(pipes,), name="log-read", daemon=True)
        reader.start()
        self._readers.append(reader)
        self.start_flushing()

    def start_flushing(self) -> None:
        """Send what is written to the store every `flush_interval_s` (`start` does it
        for a process's pipes; a python Task's log lines come through `write`)."""
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, name="log-flush", daemon=True)
            self._flusher.start()

    def write(self, stream: str, data: bytes) -> None:
        """Output of the step that does not come from a pipe (stream stdout | stderr |
        qlflow): a python Task's log lines and prints."""
        self._feed(stream, data)

    def note(self, text: str) -> None:
        """A line of the executor's own in the log (stream `qlflow`)."""
        self._feed(NOTE, (text if text.endswith("\n") else text + "\n").encode())

    def finish(self) -> None:
        """The process exited: read what is left in its pipes (until they close, or
        `DRAIN_TIMEOUT_S` if something it spawned still holds them) and send the rest
        to the store (a few tries; what is still `pending` then the caller may `send`).
        Idempotent."""
        if self._closed:
            return
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        self.close()

    @property
    def pending(self) -> bool:
        """Whether output waits to be stored."""
        with self._lock:
            return bool(self._pending)

    def send(self) -> None:
        """Store what waits now; the store's error if it cannot (what waits is kept)."""
        with self._send_lock:
            with self._lock:
                pieces, self._pending, self._pending_bytes = self._pending, [], 0
                left_out, self._left_out = self._left_out, 0
            if not pieces and not left_out:
                return
            try:
                self._rt.append_log(self.attempt_id, pieces, left_out=left_out)
            except BaseException:
                self._keep(pieces, left_out)
                raise

    def close(self) -> None:
        """Stop the flusher, send what is pending (retrying a busy store a few times),
        close the file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join()
        for attempt in range(FINAL_TRIES):
            if self._send():
                break
            if attempt + 1 < FINAL_TRIES:
                time.sleep(FLUSH_INTERVAL_S / 2)  # a pause before the store is asked again
        with self._lock:  # the file is whole; what the store still lacks stays pending
            if self._file is not None:
                self._file.close()
                self._file = None

    # -- threads -----------------------------------------------------------------------
    def _read(self, pipes: dict[str, IO[bytes] | None]) -> None:
        with selectors.DefaultSelector() as selector:
            open_pipes = {}
            for stream, pipe in pipes.items():
                if pipe is not None:
                    selector.register(pipe, selectors.EVENT_READ, stream)
                    open_pipes[pipe.fileno()] = pipe
            while selector.get_map():
                for key, _events in selector.select():
                    try:
                        data = os.read(key.fd, READ_BYTES)
                    except OSError as error:
                        log.warning("attempt %s: reading output: %s", self.attempt_id, error)
                        data = b""
                    if data:
                        self._feed(key.data, data)
                        continue
                    selector.unregister(key.fileobj)
                    with contextlib.suppress(OSError):
                        open_pipes.pop(key.fd).close()

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._send()

    def _feed(self, stream: str, data: bytes) -> None:
        at_ms = wall_clock_ms()
        with self._lock:
            if self._file is not None:
                try:
                    self._file.write(data)
                    self._file.flush()
                except OSError as error:
                    log.warning("attempt %s: log file: %s", self.attempt_id, error)
            last = self._pending[-1] if self._pending else None
            if last is not None and last[0] == stream and len(last[2]) + len(data) <= _MERGE_BYTES:
                self._pending[-1] = (stream, last[1], last[2] + data)
            else:
                self._pending.append((stream, at_ms, data))
            self._pending_bytes += len(data)
            if self._pending_bytes >= self._soon:
                self._wake.set()
            if self._pending_bytes > self._limit:
                self._keep_ends()

    def _keep_ends(self) -> None:
        """Keep the first and last halves of what waits (the store cannot be reached)."""
        half = self._limit // 2
        head: list[Piece] = []
        size = 0
        for piece in self._pending:
            if size + len(piece[2]) > half:
                break
            head.append(piece)
            size += len(piece[2])
        tail: list[Piece] = []
        size_tail = 0
        for piece in reversed(self._pending[len(head) :]):
            if size_tail + len(piece[2]) > half:
                break
            tail.insert(0, piece)
            size_tail += len(piece[2])
        left_out = self._pending_bytes - size - size_tail
        if left_out <= 0:
            return
        # counted, not noted: the store's marker says it with what its cap drops (a
        # note in the middle would itself fall to the cap)
        self._left_out += left_out
        self._pending = [*head, *tail]
        self._pending_bytes = size + size_tail

    def _send(self) -> bool:
        """Send what is pending; on failure keep it for the next try. True when done."""
        with self._send_lock:
            with self._lock:
                pieces, self._pending, self._pending_bytes = self._pending, [], 0
                left_out, self._left_out = self._left_out, 0
            if not pieces and not left_out:
                return True
            retryable: tuple[type[BaseException], ...] = (QlflowError, *transient_errors())
            try:
                self._rt.append_log(self.attempt_id, pieces, left_out=left_out)
                return True
            except retryable as error:
                log.warning("attempt %s: log not stored yet: %s", self.attempt_id, error)
                self._keep(pieces, left_out)
                return False
            except Exception as error:  # a step's log is never worth a worker's life
                log.exception("attempt %s: log not stored: %s", self.attempt_id, error)
                self._keep(pieces, left_out)
                return False

    def _keep(self, pieces: list[Piece], left_out: int) -> None:
        """Put back what could not be sent, before anything read since."""
        with self._lock:
            self._left_out += left_out
            self._pending = pieces + self._pending
            self._pending_bytes += sum(len(p[2]) for p in pieces)
            if self._pending_bytes > self._limit:
                self._keep_ends()


def note_to_log(rt: Runtime, attempt_id: str, log_path: Path, text: str) -> None:
    """Put one line of the executor's own in an Attempt's log (store and file), for an
    Attempt whose process never started. Best effort: a failure is only logged."""
    capture = LogCapture(rt, attempt_id, log_path)
    capture.note(text)
    capture.close()
