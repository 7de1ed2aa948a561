"""examples/handoff through the real command line, on both stores: parameters given
with -p, an output read downstream through QLFLOW_INPUTS, a flaky step retried."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import copy_example, qlflow, qlflow_json


def test_handoff_runs_with_params_passes_outputs_and_retries(store_url, tmp_path: Path):
    package = copy_example("handoff", tmp_path)
    done = qlflow(
        "run", str(package), "daily", "-p", "date=2026-12-07", "--run-id", "h1",
        db=store_url, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = qlflow_json("show", "h1", db=store_url, cwd=tmp_path)
    assert run["params"] == {"date": "2026-12-07", "failures": 2}
    steps = run["steps"]
    assert [a["status"] for a in steps["upload"]["attempts"]] == ["failed", "failed", "succeeded"]
    assert steps["count"]["attempts"][0]["output"] == {"date": "2026-12-07", "items": 21}
    assert steps["report"]["attempts"][0]["output"] == {
        "report": "2026-12-07: 21 items counted, 21 uploaded after 3 tries"
    }
    shown = qlflow("show", "h1", db=store_url, cwd=tmp_path)
    assert "date=2026-12-07, failures=2" in shown.stdout
    assert "#3 succeeded after 2 failed" in shown.stdout
    why = qlflow("why", "h1", db=store_url, cwd=tmp_path)
    assert "retry 2 of 3 at" in why.stdout and "retry 3 of 3 at" in why.stdout


def test_handoff_under_a_workflow_deadline_retries_before_it(store_url, tmp_path: Path):
    """A retry under a Workflow deadline is admitted from its retry time (once, its
    admission window came out empty and the Run waited for the deadline)."""
    package = copy_example("handoff", tmp_path)
    manifest = package / "qlflow.toml"
    text = manifest.read_text()
    assert "[workflows.daily]\n" in text
    deadline = "[workflows.daily]\ntimeout_ms = 60000\n"
    manifest.write_text(text.replace("[workflows.daily]\n", deadline))
    done = qlflow(
        "run", str(package), "daily", "-p", "date=2026-12-07", "--run-id", "h3",
        db=store_url, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = qlflow_json("show", "h3", db=store_url, cwd=tmp_path)
    assert run["status"] == "succeeded"
    assert [a["status"] for a in run["steps"]["upload"]["attempts"]] == [
        "failed", "failed", "succeeded",
    ]  # fmt: skip


def test_handoff_that_exhausts_its_attempts_exits_1(store_url, tmp_path: Path):
    package = copy_example("handoff", tmp_path)
    done = qlflow(
        "run", str(package), "daily", "-p", "date=2026-12-07", "-p", "failures=3",
        "--run-id", "h2", db=store_url, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    run = qlflow_json("show", "h2", db=store_url, cwd=tmp_path)
    assert len(run["steps"]["upload"]["attempts"]) == 3
    assert run["steps"]["report"]["status"] == "skipped"


def test_bad_params_exit_2_naming_the_parameter_and_start_nothing(store_url, tmp_path: Path):
    package = copy_example("handoff", tmp_path)
    assert qlflow("publish", str(package), db=store_url, cwd=tmp_path).returncode == 0
    for args, said in (
        (["-p", "failures=2"], "'date'"),
        (["-p", "date=x", "-p", "failures=two"], "'failures' is an integer"),
        (["-p", "date=x", "-p", "colour=red"], "unknown parameter 'colour'"),
        (["-p", "date"], "not name=value"),
    ):
        done = qlflow("start", "handoff", "daily", *args, db=store_url, cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert said in done.stderr
    assert qlflow_json("runs", db=store_url, cwd=tmp_path) == []
    started = qlflow_json(
        "start", "handoff", "daily", "-p", "date=2026-12-01", db=store_url, cwd=tmp_path
    )
    assert started["status"] == "created"
