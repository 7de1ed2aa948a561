"""Relaying SIGINT / SIGTERM to a callback on a helper thread."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType


class SignalRelay:
    """Delivers SIGINT / SIGTERM to `on_signal` on a helper thread.

    A Python signal handler runs on the main thread between bytecodes, possibly
    while that thread holds a lock the handler would need (an Event's, say). Here
    the C-level handler only writes the signal number to a pipe (the wakeup fd),
    and a thread reads it and calls `on_signal(signum)` — never re-entrant.
    """

    def __init__(
        self,
        on_signal: Callable[[int], None],
        signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
    ) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, _ignore_in_python) for signum in signals}
        self._on_signal = on_signal
        self._thread = threading.Thread(target=self._relay, name="signals", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                self._on_signal(signum)

    def close(self) -> None:
        """Restore the previous handlers and stop the relay thread."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write_fd)
        self._thread.join(1.0)
        os.close(self._read_fd)

    def __enter__(self) -> SignalRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ignore_in_python(signum: int, frame: FrameType | None) -> None:
    """The wakeup fd carries the signal; the Python-level handler does nothing."""
