"""The etl-python example, tested as a user would: `qlflow.testing` drives each Run
on a virtual clock, so extract's 10-minute retry takes milliseconds, and three nights
of the nightly schedule across a DST change take a few more."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from qlflow.testing import VirtualClock, run_schedules, run_to_end

PACKAGE = Path(__file__).parent
MINUTE_MS = 60_000


def test_the_flaky_extract_is_retried_and_its_output_passed_on(qlflow_runtime) -> None:
    clock = VirtualClock(now_ms=1_800_000_000_000)
    began = clock.now_ms
    run = run_to_end(qlflow_runtime, PACKAGE, "daily", params={"rows": 4}, clock=clock)
    assert run.status == "succeeded"
    assert [a.status for a in run.steps["extract"].attempts] == ["failed", "succeeded"]
    assert run.steps["transform"].output == {"count": 4, "total": 60}
    assert run.steps["load"].output == {"loaded": 4, "run": run.run_id}
    assert clock.now_ms - began == 10 * MINUTE_MS  # the backoff, on the virtual clock


def test_a_deadline_before_the_retry_times_the_run_out(qlflow_runtime) -> None:
    clock = VirtualClock(now_ms=1_800_000_000_000)
    began = clock.now_ms
    run = run_to_end(qlflow_runtime, PACKAGE, "strict", clock=clock)
    assert run.status == "timed_out"
    assert clock.now_ms - began == 5 * MINUTE_MS
    assert run.steps["load"].output is None


def test_the_nightly_fires_once_a_night_across_the_spring_forward(qlflow_runtime) -> None:
    berlin = ZoneInfo("Europe/Berlin")
    clock = VirtualClock(now_ms=_ms(datetime(2027, 3, 26, 12, 0, tzinfo=berlin)))
    runs = run_schedules(
        qlflow_runtime,
        PACKAGE,
        clock=clock,
        until_ms=_ms(datetime(2027, 3, 29, 12, 0, tzinfo=berlin)),
    )
    admitted = [datetime.fromtimestamp(run.admitted_at_ms / 1000, berlin) for run in runs]
    assert [(t.day, t.hour, t.minute) for t in admitted] == [
        (27, 2, 30),
        (28, 3, 0),  # 02:30 does not exist that night: the first instant after it
        (29, 2, 30),
    ]
    assert {run.workflow_key for run in runs} == {"nightly"}
    assert all(run.status == "succeeded" for run in runs)
    assert all(run.steps["transform"].output == {"count": 3, "total": 30} for run in runs)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)
