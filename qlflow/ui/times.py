"""Instants for people: local times, durations, relative hints, and the time-range
filter's input parsed back to epoch milliseconds."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta, timezone

from markupsafe import Markup, escape

from domain.errors import InvalidInput
from qlflow.cli.times import duration as duration  # one wording of a length of time

_DIGITS = re.compile(r"[0-9]{1,16}")
MAX_MS = 2**53 - 1


def local(ms: int | None) -> str:
    """`YYYY-MM-DD HH:MM:SS.mmm` in the server's local time ("-" for None)."""
    if ms is None:
        return "-"
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{millis:03d}"


def iso(ms: int | None) -> str:
    """ISO 8601 in UTC, for `<time datetime=…>` (the browser shows it in its own zone)."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def relative(ms: int | None, now_ms: int) -> str:
    """How long ago (or from now) `ms` is: "3m07s ago", "in 12.0s", "just now"."""
    if ms is None:
        return ""
    delta = now_ms - ms
    if abs(delta) < 1000:
        return "just now"
    return f"{duration(delta)} ago" if delta > 0 else f"in {duration(-delta)}"


def parse_instant(field: str, text: str, tz_offset_min: int | None = None) -> int | None:
    """The epoch ms a filter box holds: empty -> None; digits -> epoch ms; an ISO date
    or date-time (a browser's datetime-local value). A value without a zone is in the
    browser's zone when the page told us its offset (minutes, as JavaScript's
    getTimezoneOffset gives it), else in the server's."""
    text = text.strip()
    if not text:
        return None
    if _DIGITS.fullmatch(text):
        value = int(text)
    else:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(
                field,
                "instant",
                f"{field} must be a date, a date and time (2024-05-01T22:00) or epoch "
                f"milliseconds, got {text!r}",
            ) from None
        if parsed.tzinfo is None:
            if tz_offset_min is not None:
                parsed = parsed.replace(tzinfo=timezone(-timedelta(minutes=tz_offset_min)))
            else:
                parsed = parsed.astimezone()  # the server's local zone
        value = int(parsed.timestamp() * 1000)
    if not 0 <= value <= MAX_MS:
        raise InvalidInput(field, "instant", f"{field} is out of range: {text!r}")
    return value


def parse_offset(text: str | None) -> int | None:
    """The browser's timezone offset in minutes, or None if absent or malformed."""
    if text is None or not re.fullmatch(r"-?[0-9]{1,4}", text.strip()):
        return None
    minutes = int(text)
    return minutes if -1440 < minutes < 1440 else None


# An epoch-ms instant standing alone in a timeline sentence ("until 1796182277397"):
# 13 digits, 2001 to 2286; ids are hex words, so a number inside one never matches.
_EPOCH_MS = re.compile(r"\b[12][0-9]{12}\b")


def readable_instants(sentence: str) -> Markup:
    """`sentence` HTML-escaped, each epoch-ms instant in it shown as a local time (the
    number kept in the element's title)."""
    parts: list[str] = []
    position = 0
    for match in _EPOCH_MS.finditer(sentence):
        ms = int(match.group())
        parts.append(str(escape(sentence[position : match.start()])))
        parts.append(
            f'<time class="local" datetime="{iso(ms)}" data-ms="{ms}" title="{ms}">'
            f"{local(ms)}</time>"
        )
        position = match.end()
    parts.append(str(escape(sentence[position:])))
    return Markup("".join(parts))
