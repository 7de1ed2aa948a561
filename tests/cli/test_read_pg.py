"""The command line on PostgreSQL (cluster profile): run the failing diamond, then
every read command through the real entry point on the same fresh schema."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from tests.cli.helpers import argv, cli_env, copy_example, qlflow

pytestmark = pytest.mark.pg


def test_run_and_read_commands_on_postgresql(pg_url: str, tmp_path: Path):
    package = copy_example("diamond", tmp_path)

    done = qlflow("run", str(package), "diamond", db=pg_url, cwd=tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "skipped d" in done.stdout
    listed = _json(qlflow("runs", "--json", db=pg_url, cwd=tmp_path))
    assert [(r["package"], r["status"]) for r in listed] == [("diamond", "failed")]
    run_id = listed[0]["run_id"]

    reads = {
        "show": ("show", run_id, "--json"),
        "show at 5": ("show", run_id, "--at", "5", "--json"),
        "events": ("events", "--run", run_id, "--json"),
        "failed events": ("events", "--type", "attempt.failed,step.skipped", "--json"),
        "why": ("why", run_id),
        "why json": ("why", run_id, "--json"),
        "runs failed": ("--json", "runs", "--status", "failed"),
        "verify": ("verify",),
    }
    running = {
        name: subprocess.Popen(
            argv(*args, db=pg_url),
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in reads.items()
    }
    out = {}
    for name, process in running.items():
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, (name, stderr)
        out[name] = stdout

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
    assert events[0]["type"] == "workflow.admitted"
    assert events[-1]["global_position"] == max(e["global_position"] for e in events)
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
