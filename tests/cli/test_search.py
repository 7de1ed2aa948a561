"""Searching through the real entry point, both stores: `runs` filters and time
options, `events` newest first with a default limit, `--all`, an unknown type
refused; `--version`, flags that read as flags, codes in one case."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from tests.cli.helpers import one_error_line, qlflow, qlflow_json, write_package
from tests.cli.test_step_logs import NIGHTLY

REPORT = """
[package]
name = "report"
publisher = "acme"

[tasks.make]
command = ["true"]

[workflows.daily]
steps = [{ key = "make", task = "make" }]

[workflows.weekly]
steps = [{ key = "make", task = "make" }]
"""


def _ids(found) -> list[str]:
    return [r["run_id"] for r in found]


def test_runs_filters_and_time_options(store_url, tmp_path: Path):
    nightly = write_package(tmp_path / "nightly", NIGHTLY)
    report = write_package(tmp_path / "report", REPORT)
    for folder in (nightly, report):
        assert qlflow("publish", str(folder), db=store_url, cwd=tmp_path).returncode == 0
    started_ms = time.time_ns() // 1_000_000
    time.sleep(0.01)  # admission times strictly after `started_ms` (a clock, not a wait)
    for package, workflow, run_id in (
        ("backup", "nightly", "b1"),
        ("report", "daily", "r1"),
        ("report", "daily", "r2"),
        ("report", "weekly", "w1"),
    ):
        started = qlflow("start", package, workflow, "--run-id", run_id, db=store_url, cwd=tmp_path)
        assert started.returncode == 0, started.stderr
        time.sleep(0.002)  # distinct admission milliseconds: a strict newest-first order
    ran = qlflow("run", str(nightly), "nightly", "--run-id", "b2", db=store_url, cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr

    def runs(*options: str) -> list[str]:
        return _ids(qlflow_json("runs", *options, db=store_url, cwd=tmp_path))

    assert runs() == ["b2", "w1", "r2", "r1", "b1"]
    assert runs("--package", "report") == ["w1", "r2", "r1"]
    assert runs("--package", "report", "--workflow", "daily") == ["r2", "r1"]
    assert runs("--workflow", "nightly", "--status", "running") == ["b1"]
    assert runs("--status", "failed") == ["b2"]
    assert runs("--limit", "2") == ["b2", "w1"]
    iso = datetime.fromtimestamp(started_ms // 1000).isoformat()  # local time, no zone
    assert runs("--since", iso) == ["b2", "w1", "r2", "r1", "b1"]
    assert runs("--since", "1h", "--package", "backup") == ["b2", "b1"]
    assert runs("--until", str(started_ms)) == []
    assert runs("--until", "2999-01-01") == ["b2", "w1", "r2", "r1", "b1"]
    assert runs("--since", "2999-01-01T00:00:00+00:00") == []
    for bad in (("--since", "yesterday"), ("--until", "10 minutes"), ("--status", "sad")):
        refused = qlflow("runs", *bad, db=store_url, cwd=tmp_path)
        assert refused.returncode == 2, bad
        assert bad[0].strip("-") in one_error_line(refused.stderr)

    human = qlflow("runs", db=store_url, cwd=tmp_path)
    assert human.returncode == 0
    assert "5 run(s), newest first" in human.stdout
    assert "workflow_step_failed" in human.stdout and "WORKFLOW" not in human.stdout
    assert " ago)" in human.stdout  # local time with a relative hint


def test_events_newest_first_with_a_default_limit(store_url, tmp_path: Path):
    nightly = write_package(tmp_path / "nightly", NIGHTLY)
    for number in range(3):  # ~90 events: more than the default 50
        ran = qlflow(
            "run", str(nightly), "nightly", "--run-id", f"n{number}", db=store_url, cwd=tmp_path
        )
        assert ran.returncode == 1

    every = qlflow_json("events", "--all", db=store_url, cwd=tmp_path)
    positions = [e["global_position"] for e in every]
    assert len(every) > 50 and positions == sorted(positions, reverse=True)
    assert positions[0] == max(positions) and positions[-1] == 1
    default = qlflow_json("events", db=store_url, cwd=tmp_path)
    assert default == every[:50]
    assert qlflow_json("events", "--limit", "3", db=store_url, cwd=tmp_path) == every[:3]
    older = qlflow_json(
        "events", "--before", str(positions[2]), "--limit", "2", db=store_url, cwd=tmp_path
    )
    assert older == every[3:5]
    failed = qlflow_json(
        "events", "--type", "workflow.failed", "--since", "1h", db=store_url, cwd=tmp_path
    )
    assert [e["stream_id"] for e in failed] == ["run-n2", "run-n1", "run-n0"]
    assert qlflow_json("events", "--until", "1000", db=store_url, cwd=tmp_path) == []

    unknown = qlflow("events", "--type", "step.failed,nope", db=store_url, cwd=tmp_path)
    assert unknown.returncode == 2
    line = one_error_line(unknown.stderr)
    assert "unknown event type(s) nope" in line and "workflow.admitted" in line
    human = qlflow("events", "--limit", "5", db=store_url, cwd=tmp_path)
    assert "5 event(s) (more:" in human.stdout


def test_version_and_flags_that_read_as_flags(tmp_path: Path):
    version = qlflow("--version", db=None, cwd=tmp_path)
    assert version.returncode == 0
    assert version.stdout.startswith("qlflow ") and "Python" in version.stdout
    help_text = qlflow("events", "--help", db=None, cwd=tmp_path).stdout
    for flag in ("--json", "--all", "--follow", "--help"):
        [line] = [row for row in help_text.splitlines() if row.startswith(f"│ {flag} ")]
        assert "<bool>" not in line, line
    assert "<int>" in help_text  # options that take a value still say which
