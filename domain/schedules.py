"""The durable cursor of one schedule: a fold of its `schedule-<id>` stream and the
decisions that extend it.

The stream holds `schedule.armed {next_fire_at_ms}`, `schedule.fired
{scheduled_for_ms, run_id, next_fire_at_ms}`, `schedule.skipped {from_ms, to_ms,
next_fire_at_ms, reason}`, `schedule.paused {}`, `schedule.resumed
{next_fire_at_ms}` and `schedule.retired {}`. The cursor (`next_fire_at_ms`) is the
oldest occurrence not yet admitted or skipped, so the misfire rules never look at
more than it and the first occurrence after now: no backlog is ever replayed.

Decisions return a `ScheduleDecision`: the append (expected version = the state's)
and, when an occurrence is due, the `Occurrence` the caller admits in the same
transaction. Event ids derive from the schedule, the stream position, the type, the
observation time and what was decided: a repeat after a lost COMMIT recomputes the
same records (an exact replay), and two replicas deciding the same position at
different instants meet a version conflict, never an idempotency conflict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from domain.errors import CorruptionError, InvalidInput
from domain.event_types import EventType
from domain.fields import ID_PATTERN
from domain.ids import RUN_ID, SCHEDULE_EVENT, derive_id
from domain.occurrences import check_instant, next_after
from domain.records import NewEvent, Record, StreamAppend
from domain.schedule_spec import (
    FIRE_ONCE,
    OVERLAP_QUEUE,
    OVERLAP_SKIP,
    ScheduleSpec,
)
from domain.streams import SCHEDULE, category, entity_id, schedule_stream

ACTIVE = "active"
PAUSED = "paused"
RETIRED = "retired"
SCHEDULE_STATUSES = (ACTIVE, PAUSED, RETIRED)

SCHEDULE_ACTOR = "cycle:schedule"
USER_ACTOR = "user"
LATE = "late"  # skipped: the occurrence was past the grace and the misfire policy is skip
OVERLAP = "overlap"  # skipped: the schedule's previous Run still ran (overlap skip)
ADMISSION_KEY_PREFIX = "schedule"


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule's cursor as its stream says.

    `next_fire_at_ms` is the oldest occurrence still to admit or skip (None unless
    active); `last_fired_at_ms` / `last_run_id` name the last admitted occurrence;
    `version` is the stream's version and `head_event_id` its latest event.
    """

    schedule_id: str
    status: str
    version: int
    head_event_id: str
    next_fire_at_ms: int | None
    last_fired_at_ms: int | None = None
    last_run_id: str | None = None


@dataclass(frozen=True, slots=True)
class Occurrence:
    """An occurrence to admit: with `admission_key` and `run_id` (both derived from
    the schedule and `scheduled_for_ms`), in the same transaction as the cursor's
    append. `late` says it was admitted past the grace (misfire fire_once)."""

    schedule_id: str
    scheduled_for_ms: int
    admission_key: str
    run_id: str
    late: bool = False


@dataclass(frozen=True, slots=True)
class ScheduleDecision:
    """What a schedule decision appends (at most one StreamAppend) and admits."""

    appends: tuple[StreamAppend, ...] = ()
    admit: Occurrence | None = None

    @property
    def noop(self) -> bool:
        """True when there is nothing to append."""
        return not self.appends

    @property
    def events(self) -> tuple[NewEvent, ...]:
        """The events of the append (empty for a no-op)."""
        return self.appends[0].events if self.appends else ()


NOTHING = ScheduleDecision()


def work_at_ms(state: ScheduleState | None) -> int | None:
    """The instant a schedule next has work: the cursor of an active schedule, None
    for a paused, retired or never-armed one. Read models index this value."""
    if state is None or state.status != ACTIVE:
        return None
    return state.next_fire_at_ms


def next_occurrence(spec: ScheduleSpec, after_ms: int) -> int:
    """The schedule's first occurrence strictly after `after_ms`, in its zone."""
    return next_after(spec.cron, spec.timezone, after_ms)


def admission_key(schedule_id: str, scheduled_for_ms: int) -> str:
    """`schedule:<schedule id>:<scheduled_for_ms>`: one admission per occurrence."""
    return f"{ADMISSION_KEY_PREFIX}:{schedule_id}:{scheduled_for_ms}"


def occurrence_run_id(schedule_id: str, scheduled_for_ms: int) -> str:
    """The run id of an occurrence: the one admission derives from its key."""
    return derive_id(RUN_ID, admission_key(schedule_id, scheduled_for_ms))


# --- decisions ---------------------------------------------------------------------------


def arm(
    spec: ScheduleSpec,
    schedule_id: str,
    published_at_ms: int,
    state: ScheduleState | None = None,
) -> ScheduleDecision:
    """`schedule.armed` at the first occurrence after the publication's
    `published_at_ms`, for a schedule never armed (`state` None) or retired and
    published again. An active or paused schedule keeps its cursor: nothing to do.

    The record depends on the publication only (its `at_ms` is `published_at_ms`),
    so every replica arming the same schedule writes the same bytes.
    """
    _check_id(schedule_id)
    published_at_ms = check_instant("published_at_ms", published_at_ms)
    if state is not None:
        _check_state(state, schedule_id)
        if state.status != RETIRED:
            return NOTHING
    next_ms = next_occurrence(spec, published_at_ms)
    data = {"next_fire_at_ms": next_ms}
    return _decide(
        schedule_id, state, EventType.SCHEDULE_ARMED, data, published_at_ms, SCHEDULE_ACTOR
    )


def waits_for_previous(spec: ScheduleSpec, previous_running: bool) -> bool:
    """Whether a due occurrence is held on the cursor, admitting nothing, because the
    schedule's previous Run still runs (overlap `queue`). The read model indexes no
    work for such a schedule until that Run's end says otherwise."""
    return previous_running and spec.overlap == OVERLAP_QUEUE


def decide_due(
    state: ScheduleState,
    spec: ScheduleSpec,
    now_ms: int,
    grace_ms: int,
    *,
    refusal: str | None = None,
    previous_running: bool = False,
    previous_ended_at_ms: int | None = None,
) -> ScheduleDecision:
    """What a schedule phase does with `state` at `now_ms`.

    Not due (not active, or the cursor is after now): nothing. Due within
    `grace_ms` of the cursor: admit the cursor's occurrence and move the cursor to
    the first occurrence after now (`schedule.fired`). Later than the grace: misfire
    `skip` admits nothing (`schedule.skipped`, reason "late"), `fire_once` admits the
    cursor's occurrence — the oldest missed — and moves past now. `refusal` is the
    start guard's reason (e.g. "withdrawn"): a due occurrence is then skipped with
    that reason, whatever the grace.

    `previous_running` says the schedule's last fired Run has not ended, and
    `previous_ended_at_ms` when it did. Overlap `allow` ignores them; `skip` skips a
    due occurrence while the previous Run runs (reason "overlap"); `queue` holds it
    (nothing written) and, once the previous Run ended, admits it with its lateness
    counted from that end rather than from the occurrence.
    """
    _check_state(state)
    now_ms = check_instant("now_ms", now_ms)
    grace_ms = check_instant("grace_ms", grace_ms)
    if refusal is not None and not (isinstance(refusal, str) and refusal.isidentifier()):
        raise InvalidInput("refusal", "identifier", f"refusal must be a word, got {refusal!r}")
    if previous_ended_at_ms is not None:
        previous_ended_at_ms = check_instant("previous_ended_at_ms", previous_ended_at_ms)
    due_ms = work_at_ms(state)
    if due_ms is None or due_ms > now_ms or waits_for_previous(spec, previous_running):
        return NOTHING
    next_ms = next_occurrence(spec, now_ms)
    held_since_ms = due_ms
    if spec.overlap == OVERLAP_QUEUE and previous_ended_at_ms is not None:
        held_since_ms = max(due_ms, previous_ended_at_ms)
    late = now_ms - held_since_ms > grace_ms
    if refusal is None and previous_running and spec.overlap == OVERLAP_SKIP:
        refusal = OVERLAP
    if refusal is None and (not late or spec.misfire == FIRE_ONCE):
        occurrence = Occurrence(
            schedule_id=state.schedule_id,
            scheduled_for_ms=due_ms,
            admission_key=admission_key(state.schedule_id, due_ms),
            run_id=occurrence_run_id(state.schedule_id, due_ms),
            late=late,
        )
        data: dict[str, Any] = {
            "scheduled_for_ms": due_ms,
            "run_id": occurrence.run_id,
            "next_fire_at_ms": next_ms,
        }
        decision = _decide(
            state.schedule_id, state, EventType.SCHEDULE_FIRED, data, now_ms, SCHEDULE_ACTOR
        )
        return replace(decision, admit=occurrence)
    data = {
        "from_ms": due_ms,
        "to_ms": now_ms,
        "next_fire_at_ms": next_ms,
        "reason": refusal if refusal is not None else LATE,
    }
    return _decide(
        state.schedule_id, state, EventType.SCHEDULE_SKIPPED, data, now_ms, SCHEDULE_ACTOR
    )


def pause(state: ScheduleState, now_ms: int, *, actor: str = USER_ACTOR) -> ScheduleDecision:
    """`schedule.paused`: no fires until resumed. Pausing a paused schedule writes
    nothing; a retired one cannot be paused (InvalidInput "retired")."""
    _check_state(state)
    now_ms = check_instant("now_ms", now_ms)
    _refuse_retired(state, "pause")
    if state.status == PAUSED:
        return NOTHING
    return _decide(state.schedule_id, state, EventType.SCHEDULE_PAUSED, {}, now_ms, actor)


def resume(
    state: ScheduleState, spec: ScheduleSpec, now_ms: int, *, actor: str = USER_ACTOR
) -> ScheduleDecision:
    """`schedule.resumed` at the first occurrence after `now_ms`: what was missed
    while paused is not fired. Resuming an active schedule writes nothing."""
    _check_state(state)
    now_ms = check_instant("now_ms", now_ms)
    _refuse_retired(state, "resume")
    if state.status == ACTIVE:
        return NOTHING
    data = {"next_fire_at_ms": next_occurrence(spec, now_ms)}
    return _decide(state.schedule_id, state, EventType.SCHEDULE_RESUMED, data, now_ms, actor)


def retire(state: ScheduleState, now_ms: int, *, actor: str = SCHEDULE_ACTOR) -> ScheduleDecision:
    """`schedule.retired`: the head publication no longer declares the schedule.
    Retiring a retired schedule writes nothing."""
    _check_state(state)
    now_ms = check_instant("now_ms", now_ms)
    if state.status == RETIRED:
        return NOTHING
    return _decide(state.schedule_id, state, EventType.SCHEDULE_RETIRED, {}, now_ms, actor)


def _decide(
    schedule_id: str,
    state: ScheduleState | None,
    event_type: str,
    data: dict[str, Any],
    at_ms: int,
    actor: str,
) -> ScheduleDecision:
    version = 0 if state is None else state.version
    parts = [data[name] for name in sorted(data)]
    event_id = derive_id(SCHEDULE_EVENT, schedule_id, version + 1, event_type, at_ms, *parts)
    metadata = {
        "at_ms": at_ms,
        "causation_id": None if state is None else state.head_event_id,
        "correlation_id": schedule_id,
        "actor": actor,
    }
    event = NewEvent(event_id, event_type, data, metadata)
    append = StreamAppend(schedule_stream(schedule_id), version, (event,))
    return ScheduleDecision(appends=(append,))


def _check_id(schedule_id: object) -> None:
    if not isinstance(schedule_id, str) or not ID_PATTERN.fullmatch(schedule_id):
        raise InvalidInput(
            "schedule_id",
            "id",
            f"schedule_id must be 1-36 characters of A-Z a-z 0-9 : . _ -, got {schedule_id!r}",
        )


def _check_state(state: object, schedule_id: str | None = None) -> None:
    if not isinstance(state, ScheduleState):
        raise InvalidInput(
            "state", "type", f"state must be a ScheduleState, got {type(state).__name__}"
        )
    if schedule_id is not None and state.schedule_id != schedule_id:
        raise InvalidInput(
            "state", "schedule", f"state is of schedule {state.schedule_id!r}, not {schedule_id!r}"
        )


def _refuse_retired(state: ScheduleState, action: str) -> None:
    if state.status == RETIRED:
        raise InvalidInput(
            "schedule_id",
            "retired",
            f"schedule {state.schedule_id!r} is retired (its Workflow no longer declares it); "
            f"there is nothing to {action}",
        )


# --- folding -------------------------------------------------------------------------------


def fold_schedule(
    records: Sequence[Record], state: ScheduleState | None = None
) -> ScheduleState | None:
    """Fold a `schedule-<id>` stream (in stream order) into its state, continuing
    from `state` when given; None for an empty stream. Raises CorruptionError naming
    the first record that breaks a rule of the stream."""
    for record in records:
        state = _apply(state, record)
    return state


def _apply(state: ScheduleState | None, record: Record) -> ScheduleState:
    expected = 1 if state is None else state.version + 1
    if record.stream_version != expected:
        raise _corrupt(record, f"version gap: expected v{expected}")
    if category(record.stream_id) != SCHEDULE:
        raise _corrupt(record, "is not in a schedule stream")
    schedule_id = entity_id(record.stream_id)
    if state is not None and state.schedule_id != schedule_id:
        raise _corrupt(record, f"is not in stream {schedule_stream(state.schedule_id)}")
    data = record.data
    if not isinstance(data, Mapping):
        raise _corrupt(record, "data is not an object")
    kind = record.type
    status = None if state is None else state.status
    allowed = _ALLOWED_FROM.get(kind)
    if allowed is None:
        raise _corrupt(record, "is not a schedule event type")
    if status not in allowed:
        if status is None:
            raise _corrupt(record, "a schedule stream opens with schedule.armed")
        raise _corrupt(record, f"cannot follow a schedule that is {status}")
    base = state if state is not None else ScheduleState(schedule_id, ACTIVE, 0, "", None)
    moved = replace(base, version=record.stream_version, head_event_id=record.event_id)
    if kind in (EventType.SCHEDULE_ARMED, EventType.SCHEDULE_RESUMED):
        return replace(moved, status=ACTIVE, next_fire_at_ms=_instant(record, "next_fire_at_ms"))
    if kind == EventType.SCHEDULE_PAUSED:
        return replace(moved, status=PAUSED, next_fire_at_ms=None)
    if kind == EventType.SCHEDULE_RETIRED:
        return replace(moved, status=RETIRED, next_fire_at_ms=None)
    next_ms = _instant(record, "next_fire_at_ms")
    if kind == EventType.SCHEDULE_FIRED:
        scheduled_ms = _instant(record, "scheduled_for_ms")
        if scheduled_ms != base.next_fire_at_ms:
            raise _corrupt(record, f"fires {scheduled_ms}, not the cursor {base.next_fire_at_ms}")
        if next_ms <= scheduled_ms:
            raise _corrupt(record, "next_fire_at_ms is not after scheduled_for_ms")
        run_id = data.get("run_id")
        if run_id != occurrence_run_id(schedule_id, scheduled_ms):
            raise _corrupt(record, f"run_id {run_id!r} is not the occurrence's run id")
        return replace(
            moved, next_fire_at_ms=next_ms, last_fired_at_ms=scheduled_ms, last_run_id=run_id
        )
    from_ms, to_ms = _instant(record, "from_ms"), _instant(record, "to_ms")
    reason = data.get("reason")
    if from_ms != base.next_fire_at_ms:
        raise _corrupt(record, f"skips from {from_ms}, not the cursor {base.next_fire_at_ms}")
    if not from_ms <= to_ms < next_ms:
        raise _corrupt(record, "needs from_ms <= to_ms < next_fire_at_ms")
    if not isinstance(reason, str) or not reason:
        raise _corrupt(record, "reason is missing or not a string")
    return replace(moved, next_fire_at_ms=next_ms)


_ALLOWED_FROM: dict[str, tuple[str | None, ...]] = {
    EventType.SCHEDULE_ARMED: (None, RETIRED),
    EventType.SCHEDULE_FIRED: (ACTIVE,),
    EventType.SCHEDULE_SKIPPED: (ACTIVE,),
    EventType.SCHEDULE_PAUSED: (ACTIVE,),
    EventType.SCHEDULE_RESUMED: (PAUSED,),
    EventType.SCHEDULE_RETIRED: (ACTIVE, PAUSED),
}


def _instant(record: Record, name: str) -> int:
    value = record.data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _corrupt(record, f"{name} is missing or not an instant: {value!r}")
    return value


def _corrupt(record: Record, problem: str) -> CorruptionError:
    where = f"{record.stream_id} v{record.stream_version} ({record.event_id}, {record.type})"
    return CorruptionError(f"{where}: {problem}")
