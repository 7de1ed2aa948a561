"""The schedule phase of a cycle and the pause/resume writes (docs/DESIGN.md,
"Schedules").

The phase reads bounded pages of schedule ids whose `work_at_ms` has come (a
partial index of `projections.schedules`; a schedule with no work is never read),
and gives each one turn: one transaction that locks the schedule's stream head
without waiting, reads its row, asks the domain (`domain.schedule_heads.decide_turn`)
and appends. When the decision fires an occurrence, its Run is admitted in the same
transaction (`actors.admission.admit_in_tx`, key `schedule:<id>:<scheduled_for_ms>`),
so the admission and the cursor's advance commit together or not at all; the
append's expected version is the cursor's CAS. A start guard refusal (withdrawn,
quarantined, publisher revoked, ...) turns the fire into a `schedule.skipped` with
that reason, still advancing the cursor. The row also says whether the schedule's
last fired Run still runs, which its overlap policy decides on (skip: reason
"overlap"; queue: nothing until it ended).
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.admission import admit_in_tx
from actors.authority import Units
from domain.errors import InvalidInput, NotFound, StartGuardError, VersionConflict
from domain.event_types import EventType
from domain.schedule_heads import decide_turn
from domain.schedules import RETIRED, ScheduleDecision, pause, resume
from domain.streams import schedule_stream
from eventstore.api import Transaction
from projections import schedules as read_model
from projections.registry import commit

PHASE = "schedule"


@dataclass(frozen=True, slots=True)
class ScheduleOutcome:
    """What one schedule's turn did: `fired` admitted a Run (`run_id`), `skipped`
    advanced past an occurrence without one, `armed`/`retired` as named."""

    schedule_id: str
    changed: bool = False
    fired: bool = False
    skipped: bool = False
    blocked: bool = False
    conflict: bool = False
    run_id: str | None = None
    error: str | None = None


def turn(tx: Transaction, schedule_id: str, now_ms: int, grace_ms: int) -> ScheduleOutcome:
    """One schedule's turn in the open transaction `tx` (see the module docstring).
    A schedule armed in this turn whose first occurrence is already due fires in it
    too: at most two decisions, one after the other."""
    if tx.lock_heads([schedule_stream(schedule_id)], wait=False) is None:
        return ScheduleOutcome(schedule_id, blocked=True)
    outcome = ScheduleOutcome(schedule_id)
    for _ in range(2):
        row = read_model.row(tx, schedule_id)
        if row is None:
            return outcome
        armed_now = row.declared and (row.state is None or row.state.status == RETIRED)
        decision, run_id = _decide(tx, row, now_ms, grace_ms)
        if decision.noop:
            return outcome
        commit(tx, decision.appends)
        outcome = ScheduleOutcome(
            schedule_id,
            changed=True,
            fired=outcome.fired or run_id is not None,
            skipped=outcome.skipped
            or any(e.type == EventType.SCHEDULE_SKIPPED for e in decision.events),
            run_id=run_id or outcome.run_id,
        )
        if not armed_now:
            return outcome
    return outcome


def _decide(
    tx: Transaction, row: read_model.ScheduleRow, now_ms: int, grace_ms: int
) -> tuple[ScheduleDecision, str | None]:
    decision = decide_turn(
        row.state,
        row.declaration,
        row.declared,
        now_ms,
        grace_ms,
        previous_running=row.previous_running,
        previous_ended_at_ms=row.last_run_ended_at_ms,
    )
    if decision.admit is None:
        return decision, None
    occurrence = decision.admit
    try:
        receipt = admit_in_tx(
            tx,
            row.declaration.publication_id,
            row.declaration.workflow,
            occurrence.admission_key,
            occurrence.run_id,
            None,
            now_ms,
            params=row.declaration.spec.params_dict(),
        )
    except StartGuardError as refused:
        return _refused(row, now_ms, grace_ms, refused.reason or "refused"), None
    except NotFound:
        return _refused(row, now_ms, grace_ms, "not_published"), None
    return decision, receipt.run_id


def _refused(
    row: read_model.ScheduleRow, now_ms: int, grace_ms: int, reason: str
) -> ScheduleDecision:
    return decide_turn(
        row.state,
        row.declaration,
        row.declared,
        now_ms,
        grace_ms,
        refusal=reason,
        previous_running=row.previous_running,
        previous_ended_at_ms=row.last_run_ended_at_ms,
    )


def run_turn(authority: Units, schedule_id: str, now_ms: int, grace_ms: int) -> ScheduleOutcome:
    """One turn as its own unit of work ("schedule"); every failure is reported."""
    try:
        return authority.execute(lambda tx: turn(tx, schedule_id, now_ms, grace_ms), name=PHASE)
    except VersionConflict:
        return ScheduleOutcome(schedule_id, conflict=True)
    except Exception as error:  # another replica's admission of the same key, a lost store
        return ScheduleOutcome(schedule_id, error=f"{type(error).__name__}: {error}")


def due_page(
    authority: Units, now_ms: int, limit: int, after: tuple[int, str] | None
) -> list[tuple[int, str]]:
    """A page of schedule ids with work at `now_ms` (see `projections.schedules.due`)."""
    return read_model.due(authority.store, now_ms, limit, after)


def set_paused(authority: Units, schedule_id: str, paused: bool, now_ms: int) -> bool:
    """Pause or resume a schedule; True if this call wrote it (False: it already was).
    NotFound for an unknown schedule; InvalidInput("retired") for a retired one."""

    def unit(tx: Transaction) -> bool:
        row = read_model.row(tx, schedule_id)
        if row is None:
            raise NotFound(f"no schedule {schedule_id!r}; `qlflow schedules` lists them")
        if row.state is None:
            raise InvalidInput(
                "schedule_id",
                "not_armed",
                f"schedule {schedule_id!r} is not armed yet; run a cycle (or `qlflow serve`) first",
            )
        if paused:
            decision = pause(row.state, now_ms)
        else:
            decision = resume(row.state, row.declaration.spec, now_ms)
        if decision.noop:
            return False
        commit(tx, decision.appends)
        return True

    return authority.execute(unit, name="pause" if paused else "resume")
