"""One readable sentence about a record of a Run's streams (the timeline's prose)."""

from __future__ import annotations

from domain import event_types as types
from domain.event_types import EventType, Family
from domain.records import Record
from domain.transitions import Status


def summarize(record: Record, step_key: str | None = None) -> str:
    """One readable sentence about a record of a Run's streams."""
    data = record.data
    kind = record.type
    head, tail = types.family(kind), types.name(kind)
    step = f"step {step_key or data.get('step_key')!r}"
    if kind == EventType.WORKFLOW_ADMITTED:
        plan = data["plan"]
        timeout = plan.get("timeout_ms")
        limit = f", timeout {timeout} ms" if timeout is not None else ""
        queued = f", queued for {plan['flow']['run_slot']['limit']}" if data.get("queued") else ""
        return (
            f"admitted {plan['package']}/{plan['workflow_key']} generation {plan['generation']} "
            f"with {len(plan['steps'])} steps{limit} (key {data.get('admission_key')!r}){queued}"
        )
    if kind == EventType.WORKFLOW_DEQUEUED:
        return f"left its queue: took a slot of {data['slot']}"
    if kind == EventType.WORKFLOW_CANCEL_REQUESTED:
        actor = record.metadata.get("actor")
        return f"cancel requested: reason {data['reason']} by {actor} at {data['requested_at_ms']}"
    if head == Family.WORKFLOW:
        code = (
            f" ({data.get('result_code')}, {data.get('error_code')})"
            if tail != Status.SUCCEEDED
            else ""
        )
        return f"run {tail}{code}"
    if kind == EventType.STEP_CREATED:
        return f"{step} created {data['status']}"
    if head == Family.STEP:
        code = f" [{data['result_code']}]" if data.get("result_code") else ""
        return f"{step}: {data['from']} -> {data['to']} (epoch {data['epoch']}){code}"
    if kind == EventType.ATTEMPT_CLAIMED:
        return (
            f"attempt #{data['attempt_number']} of {step} claimed ({data['attempt_id']}) "
            f"against epoch {data['step_epoch']}"
        )
    if kind in (EventType.ATTEMPT_STARTING, EventType.ATTEMPT_RUNNING):
        return (
            f"attempt {data['attempt_id']} {tail} by worker {data.get('worker_id')} "
            f"under lease {data['lease_id']} v{data['lease_version']}"
        )
    if head == Family.ATTEMPT:
        reported = data.get("reported_outcome")
        said = f", worker reported {reported}" if reported and reported != tail else ""
        code = f" [{data['result_code']}]" if data.get("result_code") else ""
        return f"attempt {data['attempt_id']} {tail}{code}{said}"
    if kind == EventType.STEP_RUN_MUTATED:
        return (
            f"mutation: {step} {data['from']} -> {data['to']} (epoch {data['step_epoch']}, "
            f"run v{data['run_version']})"
        )
    if kind == EventType.LEASE_GRANTED:
        return (
            f"lease {data['lease_id']} granted to worker {data['worker_id']} "
            f"until {data['expires_at_ms']} (ttl {data['ttl_ms']} ms)"
        )
    if kind == EventType.LEASE_RENEWED:
        return f"lease {data['lease_id']} renewed until {data['expires_at_ms']}"
    if kind == EventType.LEASE_COMPLETED:
        return f"lease {data['lease_id']} completed ({data.get('outcome')})"
    if kind == EventType.LEASE_RELEASED:
        return f"lease {data['lease_id']} released ({data.get('reason')})"
    return kind
