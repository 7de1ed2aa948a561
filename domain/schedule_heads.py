"""Which schedules the head publication of an installation declares, and what a
schedule phase does with one schedule (docs/DESIGN.md, "Schedules").

A schedule belongs to the current head of its installation. Publishing a new
generation re-declares the installation's schedules: one it keeps (same id) keeps
its cursor, a new one is armed by the next schedule phase at its first occurrence
after the publication's `published_at_ms`, and one it no longer declares is
retired. `work_at_ms` is the instant from which a schedule has work for the phase;
the read model indexes it, so a cycle never looks at a schedule with none.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.publication import PublicationRef
from domain.revision import MaterializedRevision
from domain.schedule_spec import ScheduleSpec, schedule_id
from domain.schedules import (
    ACTIVE,
    NOTHING,
    PAUSED,
    RETIRED,
    ScheduleDecision,
    ScheduleState,
    arm,
    decide_due,
    retire,
    waits_for_previous,
)


@dataclass(frozen=True, slots=True)
class Declaration:
    """One schedule a publication declares, with its owner."""

    schedule_id: str
    publication_id: str
    project: str
    installation: str
    package: str
    publisher: str
    workflow: str
    spec: ScheduleSpec
    published_at_ms: int


def declarations(
    publication: PublicationRef, revision: MaterializedRevision, published_at_ms: int
) -> tuple[Declaration, ...]:
    """Every schedule of every Workflow of `revision`, in (workflow, manifest) order."""
    found = []
    for key, workflow in revision.workflows.items():
        for spec in workflow.schedules:
            found.append(
                Declaration(
                    schedule_id=schedule_id(publication.publisher, revision.package, key, spec),
                    publication_id=publication.publication_id,
                    project=publication.project,
                    installation=publication.installation,
                    package=revision.package,
                    publisher=publication.publisher,
                    workflow=key,
                    spec=spec,
                    published_at_ms=published_at_ms,
                )
            )
    return tuple(found)


def work_at_ms(
    state: ScheduleState | None,
    declared: bool,
    published_at_ms: int,
    *,
    waits_for_run: bool = False,
) -> int | None:
    """From when the schedule phase has work with this schedule, or None:

    - declared but never armed, or retired and declared again: arm it, from its
      publication's `published_at_ms`;
    - no longer declared but active or paused: retire it, at once (0);
    - declared and active: fire or skip, from its cursor `next_fire_at_ms` — unless
      `waits_for_run` (`domain.schedules.waits_for_previous`: overlap `queue` while the
      previous Run runs), then none until that Run ends.
    """
    status = None if state is None else state.status
    if declared:
        if status in (None, RETIRED):
            return published_at_ms
        if status == ACTIVE and state is not None:
            return None if waits_for_run else state.next_fire_at_ms
        return None
    if status in (ACTIVE, PAUSED):
        return 0
    return None


def work_pair(
    state: ScheduleState | None, declaration: Declaration, declared: bool
) -> tuple[int | None, int | None]:
    """`work_at_ms` while the schedule's previous Run runs and once it has ended: the
    read model keeps both, so the Run's end picks the second without asking again."""
    spec, at = declaration.spec, declaration.published_at_ms
    return (
        work_at_ms(state, declared, at, waits_for_run=waits_for_previous(spec, True)),
        work_at_ms(state, declared, at, waits_for_run=waits_for_previous(spec, False)),
    )


def decide_turn(
    state: ScheduleState | None,
    declaration: Declaration,
    declared: bool,
    now_ms: int,
    grace_ms: int,
    *,
    refusal: str | None = None,
    previous_running: bool = False,
    previous_ended_at_ms: int | None = None,
) -> ScheduleDecision:
    """What the schedule phase appends for one schedule at `now_ms`: arm it, retire
    it, or fire or skip its due occurrence (`domain.schedules.decide_due`, with the
    start guard's `refusal` when admission refused it and what the read model knows
    of the previous Run). Nothing when it has no work."""
    sid = declaration.schedule_id
    status = None if state is None else state.status
    if declared and status in (None, RETIRED):
        if now_ms < declaration.published_at_ms:
            return NOTHING
        return arm(declaration.spec, sid, declaration.published_at_ms, state)
    if state is None:
        return NOTHING
    if not declared:
        return retire(state, now_ms) if status in (ACTIVE, PAUSED) else NOTHING
    return decide_due(
        state,
        declaration.spec,
        now_ms,
        grace_ms,
        refusal=refusal,
        previous_running=previous_running,
        previous_ended_at_ms=previous_ended_at_ms,
    )
