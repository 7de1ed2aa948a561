"""The `events` table of the audit export's SQLite layout, which `qlflow export` and
retention archives (`qlflow.archive`) both write: one row per event with its category,
the Run it belongs to, `at_ms`, and its data and metadata as JSON text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain import streams

EVENT_COLUMNS = {
    "global_position": int,
    "event_id": str,
    "stream_id": str,
    "category": str,
    "stream_version": int,
    "type": str,
    "at_ms": int,
    "actor": str,
    "run_id": str,
    "causation_id": str,
    "correlation_id": str,
    "data": str,
    "metadata": str,
}


def event_row(
    *,
    global_position: int,
    event_id: str,
    stream_id: str,
    stream_version: int,
    type: str,
    metadata: Mapping[str, Any],
    data_json: str,
    metadata_json: str,
    run_of_attempt: Mapping[str, str],
) -> dict[str, Any]:
    """An event's row; a lease stream's Run is found in `run_of_attempt`."""
    category, entity = streams.category(stream_id), streams.entity_id(stream_id)
    run_id = entity if category in (streams.RUN, streams.STEPS) else None
    if category == streams.LEASE:
        run_id = run_of_attempt.get(entity)
    return {
        "global_position": global_position,
        "event_id": event_id,
        "stream_id": stream_id,
        "category": category,
        "stream_version": stream_version,
        "type": type,
        "at_ms": metadata.get("at_ms"),
        "actor": metadata.get("actor"),
        "run_id": run_id,
        "causation_id": metadata.get("causation_id"),
        "correlation_id": metadata.get("correlation_id"),
        "data": data_json,
        "metadata": metadata_json,
    }
