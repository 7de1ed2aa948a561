"""The command line on PostgreSQL (cluster profile): run the failing diamond, then
every read command through the real entry point on the same fresh schema."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from tests.cli.helpers import copy_example, qlflow, qlflow_many

pytestmark = pytest.mark.pg


def test_run_and_read_commands_on_postgresql(pg_url: str, tmp_path: Path):
    package = copy_example("diamond", tmp_path)

    run_id = "diamond-pg"
    done = qlflow("run", str(package), "diamond", "--run-id", run_id, db=pg_url, cwd=tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "skipped d" in done.stdout
    results = qlflow_many(
        {
            "runs": ("runs", "--json"),
            "runs failed": ("--json", "runs", "--status", "failed"),
            "show": ("show", run_id, "--json"),
            "show at 5": ("show", run_id, "--at", "5", "--json"),
            "events": ("events", "--run", run_id, "--json"),
            "failed events": ("events", "--type", "attempt.failed,step.skipped", "--json"),
            "why": ("why", run_id),
            "why json": ("why", run_id, "--json"),
            "verify": ("verify",),
        },
        db=pg_url,
        cwd=tmp_path,
    )
    for name, result in results.items():
        assert result.returncode == 0, (name, result.stderr)
    out = {name: result.stdout for name, result in results.items()}

    listed = orjson.loads(out["runs"])
    assert [(r["run_id"], r["package"], r["status"]) for r in listed] == [
        (run_id, "diamond", "failed")
    ]
    shown = orjson.loads(out["show"])
    assert {k: s["status"] for k, s in shown["steps"].items()} == {
        "a": "succeeded",
        "b": "succeeded",
        "c": "failed",
        "d": "skipped",
    }
    admitted = orjson.loads(out["show at 5"])  # 4 steps + 1: just admitted
    assert (admitted["version"], admitted["status"]) == (5, "running")
    assert {k: s["status"] for k, s in admitted["steps"].items()} == {
        "a": "ready",
        "b": "pending",
        "c": "pending",
        "d": "pending",
    }
    events = orjson.loads(out["events"])
    assert events[-1]["type"] == "workflow.admitted"  # newest first
    assert events[0]["global_position"] == max(e["global_position"] for e in events)
    failed = orjson.loads(out["failed events"])
    assert sorted(e["type"] for e in failed) == ["attempt.failed", "step.skipped"]
    assert "failed" in out["why"]
    assert orjson.loads(out["why json"])
    assert [r["run_id"] for r in orjson.loads(out["runs failed"])] == [run_id]
    assert "match" in out["verify"]

    rebuilt = _json(qlflow("rebuild", "--json", db=pg_url, cwd=tmp_path))
    assert rebuilt["tables"]["runs"] == 1
    assert _json(qlflow("show", run_id, "--json", db=pg_url, cwd=tmp_path)) == shown


def _json(done: subprocess.CompletedProcess):
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)
