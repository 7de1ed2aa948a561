"""Which errors are worth another try (a busy or unreachable database), and how long
to wait between tries."""

from __future__ import annotations

import random
import time

import eventstore

FIRST_PAUSE_S = 0.2
MAX_PAUSE_S = 5.0
LOG_EVERY_S = 30.0  # while something keeps failing, a warning at most this often


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors worth another try: a busy or unreachable database (the store says which)."""
    return eventstore.transient_errors()


class Backoff:
    """Pauses between tries of something that fails for a while: `first_s`, then
    doubling up to `cap_s` (each within ±20 %, so many hosts coming back do not
    retry in step), and back to `first_s` after a success.

    It also says when to log: the first failure, then at most every `LOG_EVERY_S`,
    so an outage of an hour is a few dozen lines, not thousands."""

    def __init__(self, first_s: float = FIRST_PAUSE_S, cap_s: float = MAX_PAUSE_S) -> None:
        self.first_s = first_s
        self.cap_s = max(cap_s, first_s)
        self.failures = 0
        self._next_s = first_s
        self._since: float | None = None
        self._logged_at: float | None = None

    @property
    def failing_for_s(self) -> float:
        """Seconds since the first failure of the current run of failures (0 if none)."""
        return 0.0 if self._since is None else time.monotonic() - self._since

    def failed(self) -> float:
        """Count one failure; the pause to wait before the next try, in seconds."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self.failures += 1
        pause = self._next_s
        self._next_s = min(self.cap_s, pause * 2)
        return pause * random.uniform(0.8, 1.2)

    def should_log(self) -> bool:
        """True for the first failure and then once per LOG_EVERY_S of failing."""
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            return True
        return False

    def describe(self, one: str, many: str) -> str:
        """The current run of failures in words: "1 failed try", "5 failed tries in 3.1 s"."""
        if self.failures <= 1:
            return f"{self.failures} {one}"
        return f"{self.failures} {many} in {self.failing_for_s:.1f} s"

    def succeeded(self) -> int:
        """Reset after a success; returns how many failures came before it."""
        failures = self.failures
        self.failures = 0
        self._next_s = self.first_s
        self._since = self._logged_at = None
        return failures
