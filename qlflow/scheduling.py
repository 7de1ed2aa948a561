"""The Runtime's calls about schedules: list them, pause one, resume one, backfill
one (docs/DESIGN.md, "Schedules"). The cycle's schedule phase fires them."""

from __future__ import annotations

from actors import schedules
from actors.backfill import BackfillResult, backfill
from projections import schedule_views
from projections.schedule_views import ScheduleView
from qlflow.arguments import text
from qlflow.store_bound import StoreBound


class Scheduling(StoreBound):
    """Mixed into `Runtime`: the calls on schedules."""

    def schedules(self) -> list[ScheduleView]:
        """Every schedule of a head publication that is not retired, by package,
        Workflow and id, with its cursor (next fire, last fire, paused)."""
        return schedule_views.list_schedules(self.store)

    def pause_schedule(self, schedule_id: str, now_ms: int | None = None) -> bool:
        """Stop a schedule's fires until it is resumed. True if this call paused it
        (False: it was paused already). NotFound for an unknown id."""
        schedule_id, now = text("schedule_id", schedule_id), self._now(now_ms)
        return schedules.set_paused(self._authority, schedule_id, True, now)

    def resume_schedule(self, schedule_id: str, now_ms: int | None = None) -> bool:
        """Fire a paused schedule again, from its first occurrence after `now_ms`:
        what it missed while paused is not fired. True if this call resumed it."""
        schedule_id, now = text("schedule_id", schedule_id), self._now(now_ms)
        return schedules.set_paused(self._authority, schedule_id, False, now)

    def backfill_schedule(
        self,
        schedule_id: str,
        from_ms: int,
        to_ms: int,
        *,
        max_runs: int = 1_000,
        dry_run: bool = False,
        now_ms: int | None = None,
    ) -> BackfillResult:
        """Admit one Run per occurrence of the schedule in [from_ms, to_ms), with the
        live firing's admission key (so never two Runs for one occurrence), at most
        `max_runs` (1..1000), in bounded transactions; `dry_run` lists them only."""
        schedule_id, now = text("schedule_id", schedule_id), self._now(now_ms)
        return backfill(
            self._authority, schedule_id, from_ms, to_ms, now, max_runs=max_runs, dry_run=dry_run
        )
