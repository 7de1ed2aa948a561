"""`qlflow schedules` and `qlflow schedule pause|resume`, and `qlflow serve` as the
scheduler: an every-minute schedule starts one Run a minute."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import qlflow
from tests.cli.helpers import (
    Spawned,
    qlflow_json,
    sqlite_url,
    wait_for,
    write_package,
)
from tests.cli.helpers import (
    qlflow as run_cli,
)
from tests.schedules.helpers import MINUTE, cycle_every, fired, ms

TOML = """
[package]
name = "ticker"
publisher = "acme"

[tasks.tick]
command = ["true"]

[workflows.tick]
steps = [{ key = "tick", task = "tick" }]
schedules = [{ cron = "* * * * *", timezone = "UTC", overlap = "allow" },
             { cron = "0 3 * * *", timezone = "Europe/Berlin", misfire = "fire_once" }]
"""
T0 = ms("2024-05-01T10:00:00Z")


@pytest.fixture
def package(tmp_path: Path) -> Path:
    return write_package(tmp_path / "ticker", TOML)


def test_an_every_minute_schedule_starts_one_run_a_minute(package, store_url):
    rt = qlflow.open(store_url)
    try:
        rt.publish(package, now_ms=T0 - 30_000)
        cycle_every(rt, T0 - 20_000, T0 + 10 * MINUTE - 1, 20_000)  # serve's cadence
        assert fired(rt) == [T0 + m * MINUTE for m in range(10)]
        runs = rt.runs(limit=100)
        assert len(runs) == 10
        assert {run.workflow_key for run in runs} == {"tick"}
    finally:
        rt.close()


def test_qlflow_schedules_lists_them_and_pause_resume_change_them(package, tmp_path):
    db = sqlite_url(tmp_path)
    now = int(time.time() * 1000)
    rt = qlflow.open(db)
    try:
        rt.publish(package, now_ms=now - 3 * MINUTE)
        rt.cycle(now_ms=now - 3 * MINUTE)  # armed at the next minute
        rt.cycle(now_ms=now - 2 * MINUTE + 1000)  # fires it
    finally:
        rt.close()
    shown = run_cli("schedules", db=db, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if "ticker tick" in line]
    assert len(lines) == 2, shown.stdout
    every, nightly = sorted(lines, key=lambda line: "Every minute" not in line)
    assert "Every minute (* * * * *)" in every and "UTC" in every and " no " in every
    assert "ago)" in every  # the last fire, two minutes ago
    assert "At 03:00 every day (0 3 * * *)" in nightly and "Europe/Berlin" in nightly
    assert " CET" in nightly or " CEST" in nightly  # next fire in the schedule's zone

    documents = qlflow_json("schedules", db=db, cwd=tmp_path)
    by_cron = {doc["cron"]: doc for doc in documents}
    minute = by_cron["* * * * *"]
    assert minute["description"] == "Every minute" and minute["paused"] is False
    assert minute["last_fired_at_ms"] is not None and minute["last_run_id"].startswith("run:")
    assert by_cron["0 3 * * *"]["misfire"] == "fire_once"

    paused = run_cli("schedule", "pause", minute["schedule_id"], db=db, cwd=tmp_path)
    assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
    again = run_cli("schedule", "pause", minute["schedule_id"], db=db, cwd=tmp_path)
    assert "already paused" in again.stdout
    listed = {d["cron"]: d for d in qlflow_json("schedules", db=db, cwd=tmp_path)}
    assert listed["* * * * *"]["paused"] is True
    assert listed["* * * * *"]["next_fire_at_ms"] is None
    shown = run_cli("schedules", db=db, cwd=tmp_path)
    assert "paused" in next(line for line in shown.stdout.splitlines() if "Every" in line)

    resumed = qlflow_json("schedule", "resume", minute["schedule_id"], db=db, cwd=tmp_path)
    assert resumed["changed"] is True and resumed["paused"] is False
    assert resumed["next_fire_at_ms"] > now  # from the resume on: nothing missed is fired

    unknown = run_cli("schedule", "pause", "sch:" + "0" * 32, db=db, cwd=tmp_path)
    assert unknown.returncode == 2 and "no schedule" in unknown.stderr


def test_no_schedules_says_how_to_declare_one(tmp_path):
    db = sqlite_url(tmp_path)
    qlflow.open(db).close()
    shown = run_cli("schedules", db=db, cwd=tmp_path)
    assert shown.returncode == 0 and "no schedules" in shown.stdout


@pytest.mark.slow
def test_qlflow_serve_fires_an_every_minute_schedule(package, tmp_path):
    """The real thing: serve's cadence is the scheduler (waits for a minute boundary)."""
    db = sqlite_url(tmp_path)
    assert run_cli("publish", str(package), db=db, cwd=tmp_path).returncode == 0
    serve = Spawned(
        "serve", "--interval-ms", "200", "--package-dir", str(package), db=db, cwd=tmp_path
    )
    try:
        run = wait_for(
            lambda: qlflow_json("runs", db=db, cwd=tmp_path) or None, 90, "a scheduled Run"
        )
        assert len(run) == 1 and run[0]["workflow_key"] == "tick"
        listed = {d["cron"]: d for d in qlflow_json("schedules", db=db, cwd=tmp_path)}
        assert listed["* * * * *"]["last_run_id"] == run[0]["run_id"]
    finally:
        serve.kill()
