"""The schedules page's reads and its pause and resume actions, through the public
Runtime API (`schedules`, `pause_schedule`, `resume_schedule`)."""

from __future__ import annotations

from collections.abc import Callable

from projections.schedule_views import ScheduleView
from qlflow.cli.schedules import zoned
from qlflow.runtime import Runtime


class Schedules:
    """Mixed into `Dashboard`."""

    runtime: Runtime
    now_ms: Callable[[], int]  # the Dashboard's clock

    def schedules(self) -> list[ScheduleView]:
        """Every schedule of a head publication that is not retired."""
        return self.runtime.schedules()

    def set_paused(self, schedule_id: str, paused: bool) -> bool:
        """Pause or resume one schedule; True if this call changed it. NotFound for
        an unknown id (the runtime's answer)."""
        if paused:
            return self.runtime.pause_schedule(schedule_id, now_ms=self.now_ms())
        return self.runtime.resume_schedule(schedule_id, now_ms=self.now_ms())


def next_fire_zoned(view: ScheduleView) -> str:
    """The next fire as the schedule's own zone shows it (as `qlflow schedules` does)."""
    if view.next_fire_at_ms is None:
        return ""
    return zoned(view.next_fire_at_ms, view.timezone)
