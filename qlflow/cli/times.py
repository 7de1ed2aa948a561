"""Times on the command line: the one place that reads them from options and the one
place that writes them for people.

Reading: every time option takes an ISO-8601 date or date-time (`2024-05-01`,
`2024-05-01T22:00`, `2024-05-01 22:00:00+02:00`; no zone means local time), a
duration ago (`90s`, `10m`, `2h`, `30d`, `1w`, or `1h30m`), or epoch milliseconds
(digits only). Writing: local time with a relative hint (`2024-05-01 22:00:03
(12s ago)`, `… (in 4m05s)`); `--json` keeps epoch milliseconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime

from qlflow.arguments import MAX_MS
from qlflow.cli.exits import CliError

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(?:[0-9]+(?:ms|[smhdw]))+")
_PART = re.compile(r"([0-9]+)(ms|[smhdw])")
_EPOCH_MS = re.compile(r"[0-9]{1,16}")
TIME_HELP = "ISO-8601 (2024-05-01T22:00, local time), a duration ago (10m, 2h, 30d) or epoch ms"


# --- reading -------------------------------------------------------------------------


def parse_duration(option: str, text: str) -> int:
    """A duration in ms: `500ms`, `90s`, `10m`, `2h`, `30d`, `1w`, or parts in a row
    (`1h30m`). A bad value is a CliError naming `option`."""
    value = text.strip().lower()
    if not _DURATION.fullmatch(value):
        raise CliError(
            f"{option} must be a duration such as 90s, 10m, 2h, 30d or 1h30m, got {text!r}"
        )
    total = sum(int(number) * _UNITS_MS[unit] for number, unit in _PART.findall(value))
    if total > MAX_MS:
        raise CliError(f"{option} is too long: {text!r}")
    return total


def is_duration(text: str) -> bool:
    """True when `text` is a duration (`30d`, `1h30m`), not a time."""
    return _DURATION.fullmatch(text.strip().lower()) is not None


def parse_time(option: str, text: str, now_ms: int) -> int:
    """An instant in epoch ms from an option: ISO-8601, a duration before `now_ms`, or
    epoch ms (see the module docstring). A bad value is a CliError naming `option`."""
    value = text.strip()
    if _EPOCH_MS.fullmatch(value):
        ms = int(value)
    elif _DURATION.fullmatch(value.lower()):
        ms = now_ms - parse_duration(option, value)
    else:
        ms = _iso(option, value)
    if not 0 <= ms <= MAX_MS:
        raise CliError(f"{option} is out of range: {text!r}")
    return ms


def optional_time(option: str, text: str | None, now_ms: int) -> int | None:
    """`parse_time` for an option that may be absent."""
    return None if text is None else parse_time(option, text, now_ms)


def _iso(option: str, value: str) -> int:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"{option} must be a time: ISO-8601 (2024-05-01 or 2024-05-01T22:00), a "
            f"duration ago (10m, 2h, 30d) or epoch milliseconds, got {value!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.astimezone()  # local time, as a person typing it means
    return int(parsed.timestamp() * 1000)


# --- writing -------------------------------------------------------------------------


def local(ms: int | None) -> str:
    """`YYYY-MM-DD HH:MM:SS` in local time ("-" for None); milliseconds when they matter
    are for `--json`."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def clock(ms: int | None) -> str:
    """`HH:MM:SS` in local time, for lines that follow something as it happens."""
    if ms is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def duration(ms: int | None) -> str:
    """A length of time, short: 830ms, 4.2s, 3m05s, 2h05m, 3d04h ("-" for None)."""
    if ms is None or ms < 0:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    minutes, seconds = divmod(ms // 1000, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def relative(ms: int, now_ms: int) -> str:
    """How far `ms` is from `now_ms`: "12s ago", "in 4m05s", "now"."""
    delta = now_ms - ms
    if abs(delta) < 1000:
        return "now"
    return f"{_rounded(delta)} ago" if delta > 0 else f"in {_rounded(-delta)}"


def when(ms: int | None, now_ms: int) -> str:
    """Local time with a relative hint: `2024-05-01 22:00:03 (12s ago)` ("-" for None)."""
    if ms is None:
        return "-"
    return f"{local(ms)} ({relative(ms, now_ms)})"


def teller(now_ms: int) -> Callable[[int | None], str]:
    """`when` bound to `now_ms`: what sentences built elsewhere write instants with."""
    return lambda ms: when(ms, now_ms)


def _rounded(ms: int) -> str:
    """A relative distance, as coarse as people say it: 12s, 4m05s, 3h10m, 2d05h."""
    if ms < 60_000:
        return f"{ms // 1000}s"
    return duration(ms)
