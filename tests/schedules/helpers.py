"""Builders for schedule tests: a manifest with schedules, instants, and what fired."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms(text: str) -> int:
    """Epoch ms of an ISO 8601 instant ("Z" allowed)."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def iso(at_ms: int) -> str:
    """The instant in UTC, to the minute: 2024-03-31T01:00Z."""
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%MZ")


def schedule(
    cron: str, timezone: str = "UTC", overlap: str | None = "allow", **extra: Any
) -> dict[str, Any]:
    """One schedule entry. These tests fire Runs nobody runs, so by default the entry
    lets them overlap (`overlap = "allow"`); `overlap=None` leaves the key out (the
    manifest's default, `skip`)."""
    entry = {"cron": cron, "timezone": timezone, **extra}
    if overlap is not None:
        entry["overlap"] = overlap
    return entry


def manifest(
    *schedules: dict[str, Any],
    package: str = "nightly",
    publisher: str = "acme",
    workflow: str = "flow",
    command: tuple[str, ...] = ("true",),
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One Task, one one-step Workflow with the given schedules (and parameters)."""
    flow: dict[str, Any] = {"steps": [{"key": "job", "task": "job"}], "schedules": list(schedules)}
    if params is not None:
        flow["params"] = params
    return {
        "package": {"name": package, "publisher": publisher},
        "tasks": {"job": {"command": list(command)}},
        "workflows": {workflow: flow},
    }


def fired(rt) -> list[int]:
    """scheduled_for_ms of every schedule.fired event, in log order."""
    return [e.data["scheduled_for_ms"] for e in rt.events(types=["schedule.fired"])]


def skipped(rt) -> list[dict[str, Any]]:
    return [dict(e.data) for e in rt.events(types=["schedule.skipped"])]


def scheduled_runs(rt) -> list[str]:
    """Run ids of every Run, oldest first."""
    return sorted(run.run_id for run in rt.runs(limit=10_000))


def cycle_every(rt, start_ms: int, end_ms: int, step_ms: int) -> None:
    """Cycles at start, start + step, ... up to end (inclusive)."""
    at = start_ms
    while at <= end_ms:
        result = rt.cycle(now_ms=at)
        assert result.schedule.errors == (), result.schedule.errors
        at += step_ms


def log_of(rt) -> list[tuple[str, int, str, str, Any, Any]]:
    """Every event as (stream, version, id, type, data, metadata): to compare two logs."""
    return [
        (e.stream_id, e.stream_version, e.event_id, e.type, e.data, e.metadata) for e in rt.events()
    ]
