"""`qlflow run` through the real entry point on SQLite: success, failure with skip
propagation, timeout, and every read command on the result."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.cli.helpers import (
    Spawned,
    copy_example,
    json_of,
    qlflow,
    qlflow_json,
    qlflow_many,
    sqlite_url,
    wait_for,
)


def test_run_nightly_succeeds_and_every_read_command_shows_it(tmp_path: Path):
    package = copy_example("nightly", tmp_path)
    db = sqlite_url(tmp_path)
    run_id = "nightly-1"

    done = qlflow("run", str(package), "nightly", "--run-id", run_id, db=db, cwd=tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded" in done.stdout
    assert (package / "out.tgz").is_file()  # the archive step ran after fetch
    out = qlflow_many(
        {
            "runs": ("runs", "--json"),
            "show": ("show", run_id, "--json"),
            "show human": ("show", run_id),
            "show at 3": ("show", run_id, "--at", "3", "--json"),
            "events": ("events", "--run", run_id, "--json"),
            "succeeded events": ("events", "--type", "attempt.succeeded", "--json"),
            "why": ("why", run_id),
            "verify": ("verify",),
            "cancel": ("cancel", run_id, "--json"),
            "cycle": ("cycle", "--json"),
        },
        db=db,
        cwd=tmp_path,
    )

    assert [(r["run_id"], r["status"]) for r in json_of(out["runs"])] == [(run_id, "succeeded")]
    shown = json_of(out["show"])
    assert shown["status"] == "succeeded"
    assert {k: s["status"] for k, s in shown["steps"].items()} == {
        "fetch": "succeeded",
        "archive": "succeeded",
    }
    fetch_output = shown["steps"]["fetch"]["attempts"][0]["execution"]
    assert shown["steps"]["fetch"]["attempts"][0]["output"] is None  # it wrote none
    assert fetch_output["exit_code"] == 0
    log_text = Path(fetch_output["log_path"]).read_text(encoding="utf-8")
    assert "fetched data/fetched.txt" in log_text
    assert (package / "data" / "fetched.txt").read_text() == f"fetched for run {run_id}\n"
    assert Path(fetch_output["log_path"]).is_relative_to(tmp_path / ".qlflow-logs")

    human = out["show human"].stdout
    assert "fetch" in human and "archive" in human
    assert fetch_output["log_path"] in human

    admitted = json_of(out["show at 3"])  # 2 steps + 1: just admitted
    assert (admitted["version"], admitted["status"]) == (3, "running")
    assert {k: (s["status"], s["attempts"]) for k, s in admitted["steps"].items()} == {
        "fetch": ("ready", []),
        "archive": ("pending", []),
    }

    events = json_of(out["events"])
    types = [e["type"] for e in events]
    # newest first: the last completion's commit carries the Run's end; in a commit
    # the lease record follows the Run's records (the audit's order)
    assert types[0] == "lease.completed"
    assert next(t for t in types if t.startswith("workflow.")) == "workflow.succeeded"
    assert types[-1] == "workflow.admitted"
    positions = [e["global_position"] for e in events]
    assert positions == sorted(positions, reverse=True)
    assert sorted(e["data"]["attempt_id"] for e in json_of(out["succeeded events"])) == sorted(
        s["attempts"][0]["attempt_id"] for s in shown["steps"].values()
    )

    assert out["why"].returncode == 0, out["why"].stderr
    assert "succeeded" in out["why"].stdout
    assert out["verify"].returncode == 0, out["verify"].stdout + out["verify"].stderr
    assert json_of(out["cancel"]) == {
        "run_id": run_id,
        "recorded": False,
        "status": "succeeded",
        "cancel_reason": None,
    }
    assert all(phase["settled_runs"] == 0 for phase in json_of(out["cycle"]).values())

    rebuilt = qlflow_json("rebuild", db=db, cwd=tmp_path)
    assert rebuilt["position"] >= max(e["global_position"] for e in events)
    assert rebuilt["tables"]["runs"] == 1
    assert qlflow_json("show", run_id, db=db, cwd=tmp_path) == shown


def test_failing_diamond_exits_1_and_shows_the_skipped_step(tmp_path: Path):
    package = copy_example("diamond", tmp_path)
    db = sqlite_url(tmp_path)

    done = qlflow("run", str(package), "diamond", "--run-id", "diamond-1", db=db, cwd=tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "skipped" in done.stdout
    assert "failed c; skipped d" in done.stdout
    shown = qlflow_json("show", "diamond-1", db=db, cwd=tmp_path)
    assert shown["status"] == "failed"
    assert shown["error_code"] == "workflow_step_failed"
    steps = shown["steps"]
    assert {k: s["status"] for k, s in steps.items()} == {
        "a": "succeeded",
        "b": "succeeded",
        "c": "failed",
        "d": "skipped",
    }
    assert steps["c"]["result_code"] == "execution_failed"
    assert steps["c"]["attempts"][0]["execution"]["exit_code"] == 1
    assert steps["d"]["result_code"] == "dependency_not_succeeded"
    assert steps["d"]["attempts"] == []  # never ran
    c_log = Path(steps["c"]["attempts"][0]["execution"]["log_path"]).read_text()
    assert "failing on purpose" in c_log


def test_run_past_its_timeout_is_stopped_and_exits_4(tmp_path: Path):
    package = copy_example("long", tmp_path)
    db = sqlite_url(tmp_path)
    pid_file = tmp_path / "work.pid"

    run = Spawned(
        "run",
        str(package),
        "long",
        "--timeout-ms",
        "2500",
        "--json",
        db=db,
        cwd=tmp_path,
        env={"LONG_PID_FILE": str(pid_file)},
    )
    try:
        assert run.wait(30) == 4, run.stderr
    finally:
        run.kill()
    shown = orjson.loads(run.stdout)
    assert shown["status"] == "timed_out"
    assert shown["cancel_reason"] == "timeout"
    work = shown["steps"]["work"]
    assert work["status"] == "timed_out"
    assert work["attempts"][0]["execution"]["exit_code"] == 143  # it got SIGTERM
    assert shown["steps"]["report"]["status"] == "cancelled"  # never ran
    assert wait_for(lambda: pid_file.exists(), 1, "the pid file")
