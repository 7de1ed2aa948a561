"""A schedule backfill admits one Run per occurrence with the live firing's admission
key, in bounded transactions, and refuses a bad range writing nothing."""

from __future__ import annotations

import pytest

import qlflow
from domain.backfill import BACKFILL_BATCH
from domain.schedules import admission_key, occurrence_run_id
from qlflow.errors import InvalidInput, NotFound
from tests.cli.helpers import qlflow as run_cli
from tests.cli.helpers import qlflow_json
from tests.schedules.helpers import DAY, HOUR, MINUTE, fired, manifest, ms, schedule

DAY0 = ms("2024-05-01T00:00:00Z")


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def _schedule_id(rt) -> str:
    (view,) = rt.schedules()
    return view.schedule_id


def test_a_backfill_admits_each_occurrence_once_with_the_live_key(rt):
    rt.publish(manifest(schedule("0 */6 * * *")), now_ms=DAY0 + 10 * DAY)
    schedule_id = _schedule_id(rt)
    result = rt.backfill_schedule(schedule_id, DAY0, DAY0 + 2 * DAY, now_ms=DAY0 + 10 * DAY)
    instants = [DAY0 + h * HOUR for h in range(0, 48, 6)]
    assert [r.scheduled_for_ms for r in result.runs] == instants
    assert {r.status for r in result.runs} == {"created"} and not result.more
    for run in result.runs:
        assert run.admission_key == admission_key(schedule_id, run.scheduled_for_ms)
        assert run.run_id == occurrence_run_id(schedule_id, run.scheduled_for_ms)
    assert len(rt.runs(limit=100)) == len(instants)

    again = rt.backfill_schedule(schedule_id, DAY0, DAY0 + 2 * DAY, now_ms=DAY0 + 11 * DAY)
    assert [r.run_id for r in again.runs] == [r.run_id for r in result.runs]
    assert {r.status for r in again.runs} == {"existing"}
    assert len(rt.runs(limit=100)) == len(instants)
    assert rt.verify_projections().ok


def test_the_live_schedule_does_not_admit_a_backfilled_occurrence_twice(rt):
    rt.publish(manifest(schedule("0 12 * * *")), now_ms=DAY0)
    schedule_id = _schedule_id(rt)
    rt.cycle(now_ms=DAY0 + MINUTE)  # armed: next fire at noon
    ahead = rt.backfill_schedule(schedule_id, DAY0, DAY0 + DAY, now_ms=DAY0 + 2 * MINUTE)
    (noon,) = ahead.runs
    assert noon.scheduled_for_ms == DAY0 + 12 * HOUR
    rt.cycle(now_ms=DAY0 + 12 * HOUR + MINUTE)
    assert fired(rt) == [DAY0 + 12 * HOUR]
    assert [r.run_id for r in rt.runs(limit=10)] == [noon.run_id]


def test_dry_run_lists_and_writes_nothing_and_max_bounds_the_call(rt):
    rt.publish(manifest(schedule("*/10 * * * *")), now_ms=DAY0)
    schedule_id = _schedule_id(rt)
    events = len(rt.events())
    planned = rt.backfill_schedule(schedule_id, DAY0, DAY0 + DAY, dry_run=True, now_ms=DAY0)
    assert len(planned.runs) == 144 and {r.status for r in planned.runs} == {"planned"}
    assert len(rt.events()) == events and rt.runs() == []
    bounded = rt.backfill_schedule(schedule_id, DAY0, DAY0 + 3 * DAY, max_runs=250, now_ms=DAY0)
    assert len(bounded.runs) == 250 > BACKFILL_BATCH and bounded.more
    assert len(rt.runs(limit=1_000)) == 250


@pytest.mark.parametrize(
    ("span", "kwargs", "field"),
    [
        ((DAY0 + DAY, DAY0), {}, "to_ms"),  # backwards
        ((DAY0, DAY0), {}, "to_ms"),  # empty
        ((DAY0, DAY0 + 367 * DAY), {}, "to_ms"),  # over a year
        ((DAY0, DAY0 + DAY), {"max_runs": 0}, "max_runs"),
        ((DAY0, DAY0 + DAY), {"max_runs": 1_001}, "max_runs"),
        ((-1, DAY0), {}, "from_ms"),
    ],
)
def test_a_bad_range_is_refused_and_writes_nothing(rt, span, kwargs, field):
    rt.publish(manifest(schedule("0 * * * *")), now_ms=DAY0)
    schedule_id, events = _schedule_id(rt), len(rt.events())
    with pytest.raises(InvalidInput) as refused:
        rt.backfill_schedule(schedule_id, *span, now_ms=DAY0, **kwargs)
    assert refused.value.field == field
    assert len(rt.events()) == events


def test_an_unknown_schedule_is_not_found(rt):
    rt.publish(manifest(schedule("0 * * * *")), now_ms=DAY0)
    with pytest.raises(NotFound):
        rt.backfill_schedule("sch:nope", DAY0, DAY0 + DAY, now_ms=DAY0)


def test_backfill_from_the_command_line(store_url, tmp_path):
    with qlflow.open(store_url) as rt:
        rt.publish(manifest(schedule("0 0 * * *")), now_ms=DAY0)
        schedule_id = _schedule_id(rt)
    start, end = ms("2024-04-01T00:00:00Z"), ms("2024-04-08T00:00:00Z")
    args = ("schedule", "backfill", schedule_id, "--from", str(start), "--to", str(end))
    planned = qlflow_json(*args, "--dry-run", db=store_url, cwd=tmp_path)
    assert len(planned["runs"]) == 7 and planned["dry_run"] is True
    done = qlflow_json(*args, db=store_url, cwd=tmp_path)
    assert [r["run_id"] for r in done["runs"]] == [r["run_id"] for r in planned["runs"]]
    text = run_cli(*args, db=store_url, cwd=tmp_path)
    assert text.returncode == 0 and "admitted 0 of 7 occurrences" in text.stdout
    bad = run_cli("schedule", "backfill", schedule_id, "--from", "yesterday-ish", "--to", "1h",
                  db=store_url, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "--from" in bad.stderr
