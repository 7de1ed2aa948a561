"""The etl-python example, tested as a user would: `qlflow.testing` drives each Run
on a virtual clock, so extract's 10-minute retry takes milliseconds."""

from __future__ import annotations

from pathlib import Path

from qlflow.testing import VirtualClock, run_to_end

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
