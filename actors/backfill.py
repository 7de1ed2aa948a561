"""A schedule backfill: admit the Runs of past (or future) occurrences in bounded
transactions (docs/DESIGN.md, "Schedules")."""

from __future__ import annotations

from dataclasses import dataclass

from actors.admission import admit_in_tx
from actors.authority import Units
from domain.backfill import BACKFILL_BATCH, check_range, occurrences_between
from domain.errors import NotFound
from domain.schedules import admission_key, occurrence_run_id
from eventstore.api import Transaction
from projections import schedules as read_model

PLANNED = "planned"  # what a dry run reports for an occurrence it did not admit


@dataclass(frozen=True, slots=True)
class BackfilledRun:
    """One occurrence of a backfill: its instant, its Run and admission key, and
    `status`: "created", "existing" (already admitted, by the live schedule or an
    earlier backfill) or "planned" (a dry run)."""

    scheduled_for_ms: int
    run_id: str
    admission_key: str
    status: str


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What `backfill_schedule` did: the occurrences in order, and `more` when the
    range holds more than `max_runs` (call again from the last one)."""

    schedule_id: str
    runs: tuple[BackfilledRun, ...]
    more: bool
    dry_run: bool


def backfill(
    authority: Units,
    schedule_id: str,
    from_ms: int,
    to_ms: int,
    now_ms: int,
    *,
    max_runs: int,
    dry_run: bool,
) -> BackfillResult:
    """Admit one Run per occurrence of `schedule_id` in `[from_ms, to_ms)`, at most
    `max_runs`, BACKFILL_BATCH per transaction; a dry run writes nothing."""
    from_ms, to_ms, max_runs = check_range(from_ms, to_ms, max_runs)
    row = authority.execute(lambda tx: read_model.row(tx, schedule_id), name="backfill")
    if row is None or not row.declared:
        raise NotFound(f"no schedule {schedule_id!r}; `qlflow schedules` lists them")
    declaration = row.declaration
    instants, more = occurrences_between(declaration.spec, from_ms, to_ms, max_runs)
    if dry_run:
        planned = tuple(
            BackfilledRun(at, occurrence_run_id(schedule_id, at), admission_key(schedule_id, at),
                          PLANNED)
            for at in instants
        )  # fmt: skip
        return BackfillResult(schedule_id, planned, more, dry_run=True)

    def admit(batch: list[int]) -> list[BackfilledRun]:
        def unit(tx: Transaction) -> list[BackfilledRun]:
            done = []
            for at in batch:
                key = admission_key(schedule_id, at)
                receipt = admit_in_tx(
                    tx,
                    declaration.publication_id,
                    declaration.workflow,
                    key,
                    occurrence_run_id(schedule_id, at),
                    None,
                    now_ms,
                    params=declaration.spec.params_dict(),
                )
                done.append(BackfilledRun(at, receipt.run_id, key, receipt.status))
            return done

        return authority.execute(unit, name="backfill")

    admitted: list[BackfilledRun] = []
    for start in range(0, len(instants), BACKFILL_BATCH):
        admitted += admit(instants[start : start + BACKFILL_BATCH])
    return BackfillResult(schedule_id, tuple(admitted), more, dry_run=False)
