"""A Run's cancel intent from the fields that carry it: a recorded intent wins;
otherwise a reached deadline is a `timeout` intent whose cancel time is the deadline.

Both the aggregate's `RunState` and a read model's view of a Run have these fields,
so a host holding only a view asks the same rule (`effective_intent` states it for
an aggregate)."""

from __future__ import annotations

from typing import Protocol


class IntentFields(Protocol):
    """What a Run's cancel intent is decided from."""

    @property
    def cancel_reason(self) -> str | None: ...

    @property
    def cancel_requested_at_ms(self) -> int | None: ...

    @property
    def deadline_ms(self) -> int | None: ...


def cancel_intent(run: IntentFields, now_ms: int) -> tuple[str, int] | None:
    """The Run's cancel intent as (reason, cancel time) at `now_ms`, or None."""
    if run.cancel_reason is not None and run.cancel_requested_at_ms is not None:
        return run.cancel_reason, run.cancel_requested_at_ms
    if run.deadline_ms is not None and now_ms >= run.deadline_ms:
        return "timeout", run.deadline_ms
    return None
