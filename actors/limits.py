"""Limits changed at runtime (docs/DESIGN.md "Flow control"): `limits set` appends
`limit.set` (who, when, the old and the new value) to the target's `limit-` stream at
the version it read — the stream's compare-and-set — and the read model
`flow_limits` folds it in the same commit, so the next lease reads it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from actors.authority import Units
from domain.event_types import EventType
from domain.flow import (
    Concurrency,
    check_limit,
    declared_for,
    effective_limit,
    parse_target,
    target_digest,
)
from domain.ids import LIMIT_EVENT, derive_id
from domain.records import NewEvent, StreamAppend
from domain.streams import limit_stream
from eventstore.api import Transaction
from projections import limits as limit_rows
from projections.registry import commit


@dataclass(frozen=True, slots=True)
class LimitChange:
    """What `set_limit` did: the target's limit before and after (`changed` False: it
    was set to that value already, nothing was written)."""

    target: str
    old: int
    new: int
    changed: bool
    set_by: str
    set_at_ms: int


def set_limit(
    authority: Units,
    target_text: str,
    slots: int,
    set_by: str,
    now_ms: int,
    declared: Mapping[str, Concurrency],
) -> LimitChange:
    """Set the limit of a declared limit, or of one key value of a keyed limit
    (`declared`: the limits the packages' heads declare). InvalidInput (nothing
    written) for a target that is not declared, or a limit out of 1..10,000."""
    target = parse_target(target_text)
    new = check_limit(slots, "limit")
    declaration = declared_for(target, declared)

    def unit(tx: Transaction) -> LimitChange:
        found = limit_rows.override(tx, target.slot)
        version = 0 if found is None else found[1]
        set_limits = limit_rows.override_values(tx, (target.slot, target.limit))
        old = effective_limit(target.slot, declaration.limit, set_limits)
        if found is not None and found[0] == new:
            return LimitChange(target.slot, old, new, False, set_by, now_ms)
        event = NewEvent(
            derive_id(LIMIT_EVENT, target.slot, version + 1),
            EventType.LIMIT_SET,
            {"target": target.slot, "old": old, "new": new, "set_at_ms": now_ms},
            {"at_ms": now_ms, "causation_id": None, "correlation_id": None, "actor": set_by},
        )
        stream = limit_stream(target_digest(target.slot))
        commit(tx, [StreamAppend(stream, version, (event,))])
        return LimitChange(target.slot, old, new, True, set_by, now_ms)

    return authority.execute(unit, name="limit")
