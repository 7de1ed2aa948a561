"""Exactly one Run per occurrence: after a SIGKILL at each commit point of the
schedule phase (between the admission's append and the cursor's, before COMMIT,
after COMMIT before the answer), and with two runtimes — two processes on
PostgreSQL — cycling the same due schedules. The recovered log must equal the log
of the same script run once without a crash, event for event."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import qlflow
from tests.schedules.helpers import HOUR, MINUTE, fired, log_of, manifest, ms, schedule

REPO = Path(__file__).resolve().parents[2]
T0 = ms("2024-05-01T00:00:00Z")
SCRIPT = {
    "manifest": manifest(schedule("0 * * * *"), schedule("*/30 * * * *", "Europe/Berlin")),
    "published_at_ms": T0 - 2 * MINUTE,
    # arm; fire 00:00 (both); fire 00:30; fire 01:00 (both)
    "cycles": [T0 - MINUTE, T0 + MINUTE, T0 + 31 * MINUTE, T0 + HOUR + 2 * MINUTE],
}


def run_child(url: str, fault: str | None = None, script=SCRIPT, profile="default"):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("QLFLOW_FAULT", None)
    if fault is not None:
        env["QLFLOW_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "tests.schedules.child", url, profile, orjson.dumps(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def final_log(url: str):
    rt = qlflow.open(url)
    try:
        assert rt.verify_projections().ok
        return log_of(rt), fired(rt), len(rt.runs(limit=1000))
    finally:
        rt.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('reference') / 'ref.db'}"
    done = run_child(url)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    log, fires, runs = final_log(url)
    assert sorted(fires) == [T0, T0, T0 + 30 * MINUTE, T0 + HOUR, T0 + HOUR]
    assert runs == 5
    return log


# schedule.after_append: #1 and #2 arm the two schedules (cycle 1); #3 is the first
# fire's admission, #4 its cursor advance
POINTS = [
    "schedule.after_append@3",  # admitted, cursor not yet appended
    "schedule.after_append@4",  # both appended, not committed
    "schedule.before_commit@3",
    "schedule.after_commit@3",  # committed, the answer lost with the process
    "schedule.after_commit@5",  # a later fire
    "schedule.after_begin@4",
]


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_a_schedule_commit_point_loses_and_duplicates_nothing(
    reference, store_url, point
):
    crashed = run_child(store_url, f"{point}=kill")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    recovered = run_child(store_url)
    assert recovered.returncode == 0 and recovered.stderr == "", recovered.stderr
    log, fires, runs = final_log(store_url)
    assert sorted(fires) == [T0, T0, T0 + 30 * MINUTE, T0 + HOUR, T0 + HOUR]
    assert runs == 5
    assert _comparable(log) == _comparable(reference)


def _comparable(log):
    # a PostgreSQL store and a SQLite one give the same records; ordering across
    # streams is the commit order, which is the script's on both
    return sorted(log, key=lambda e: (e[0], e[1]))


def test_two_runtimes_cycling_the_same_due_schedules_admit_one_run_each(store_url):
    first, second = qlflow.open(store_url), qlflow.open(store_url)
    try:
        first.publish(SCRIPT["manifest"], now_ms=T0 - 2 * MINUTE)
        for now_ms in SCRIPT["cycles"]:
            # the second cycles the same instant after the first committed, and again
            # interleaved: it finds nothing due, never a second Run
            first.cycle(now_ms=now_ms)
            second.cycle(now_ms=now_ms)
            second.cycle(now_ms=now_ms + 1000)
        assert sorted(fired(first)) == [T0, T0, T0 + 30 * MINUTE, T0 + HOUR, T0 + HOUR]
        assert len(first.runs(limit=100)) == 5
    finally:
        first.close()
        second.close()


@pytest.mark.pg
def test_two_processes_on_postgresql_cycling_the_same_schedules_admit_one_run_each(pg_url):
    minutes = [T0 + m * MINUTE + 500 for m in range(0, 6 * 60, 3)]
    script = {
        "manifest": manifest(schedule("*/5 * * * *"), schedule("0 * * * *"), package="many"),
        "published_at_ms": T0 - MINUTE,
        "cycles": [T0 - MINUTE, *minutes],
    }
    env_script = orjson.dumps(script)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.schedules.child", pg_url, "cluster", env_script],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    rt = qlflow.open(pg_url)
    try:
        fires = fired(rt)
        expected = [T0 + m * MINUTE for m in range(0, 6 * 60, 5)]
        expected += [T0 + h * HOUR for h in range(6)]
        assert sorted(fires) == sorted(expected)
        assert len(fires) == len(
            set(zip(fires, [e.stream_id for e in rt.events(types=["schedule.fired"])], strict=True))
        )
        assert len(rt.runs(limit=1000)) == len(expected)
        assert rt.verify_projections().ok
    finally:
        rt.close()
