"""`qlflow retain` through the real entry point on both stores: a dry run says what
would go, a real one removes the Run with its local logs, and `show`, `why`, `logs`
and a start with the same admission key then say it was pruned by retention; bad
ages and times are one error line with nothing removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import one_error_line, qlflow, qlflow_json, write_package
from tests.cli.test_step_logs import NIGHTLY


def test_a_finished_run_is_retained_away_and_every_reader_says_so(store_url, tmp_path: Path):
    package = write_package(tmp_path / "nightly", NIGHTLY)
    done = qlflow("run", str(package), "nightly", db=store_url, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    [run] = qlflow_json("runs", db=store_url, cwd=tmp_path)
    short = run["short_id"]
    folder = tmp_path / ".qlflow-logs" / run["run_id"].replace(":", "_")
    assert folder.is_dir()

    dry = qlflow_json("retain", "--finished-before", "1ms", "--dry-run", db=store_url, cwd=tmp_path)
    assert dry["dry_run"] and dry["runs"] == 1 and dry["events"] > 0
    assert qlflow_json("runs", db=store_url, cwd=tmp_path) != []

    removed = qlflow("retain", "--finished-before", "1ms", db=store_url, cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    assert "removed 1 run(s)" in removed.stdout
    assert "batch 1: 1 run(s)" in removed.stderr
    assert qlflow_json("runs", db=store_url, cwd=tmp_path) == []
    assert not folder.exists()  # the local step logs went with it

    for command in (("show", short), ("why", short), ("logs", short)):
        answer = qlflow(*command, db=store_url, cwd=tmp_path)
        assert answer.returncode == 2, (command, answer.stdout)
        assert "pruned by retention on" in one_error_line(answer.stderr), command
    verified = qlflow("verify", db=store_url, cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout


@pytest.mark.parametrize("value", ["0d", "0ms", "-5d", "2999-01-01", "yesterday"])
def test_a_bad_age_or_time_is_one_error_line_and_nothing_goes(store_url, tmp_path, value):
    package = write_package(tmp_path / "nightly", NIGHTLY)
    qlflow("run", str(package), "nightly", db=store_url, cwd=tmp_path)

    done = qlflow("retain", "--finished-before", value, db=store_url, cwd=tmp_path)

    assert done.returncode == 2, done.stdout
    one_error_line(done.stderr)
    assert len(qlflow_json("runs", db=store_url, cwd=tmp_path)) == 1


def test_an_archive_written_by_retain_is_read_by_show_and_events(store_url, tmp_path: Path):
    package = write_package(tmp_path / "nightly", NIGHTLY)
    qlflow("run", str(package), "nightly", db=store_url, cwd=tmp_path)
    [run] = qlflow_json("runs", db=store_url, cwd=tmp_path)
    before = qlflow_json("events", "--run", run["short_id"], "--all", db=store_url, cwd=tmp_path)
    (tmp_path / "notes.db").write_text("not an archive")

    refused = qlflow(
        "retain", "--finished-before", "1ms", "--archive", "notes.db", db=store_url, cwd=tmp_path
    )
    assert refused.returncode == 2
    assert "not a qlflow retention archive" in one_error_line(refused.stderr)
    assert len(qlflow_json("runs", db=store_url, cwd=tmp_path)) == 1

    done = qlflow(
        "retain", "--finished-before", "1ms", "--archive", "old.db", db=store_url, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    archived = qlflow_json(
        "events", "--archive", "old.db", "--run", run["short_id"], "--all", db=None, cwd=tmp_path
    )
    assert [e["event_id"] for e in archived] == [e["event_id"] for e in before]
    by_argument = qlflow_json(  # the Run as an argument, as `show` takes it
        "events", "--archive", "old.db", run["short_id"], "--all", db=None, cwd=tmp_path
    )
    assert by_argument == archived
    shown = qlflow_json("show", "--archive", "old.db", run["short_id"], db=None, cwd=tmp_path)
    assert (shown["run_id"], shown["status"]) == (run["run_id"], "failed")
    table = qlflow("show", "--archive", "old.db", run["short_id"], db=None, cwd=tmp_path)
    assert table.returncode == 0 and "archive" in table.stdout


@pytest.mark.parametrize("args", [["--retain-finished", "0d"], ["--retain-logs", "soon"]])
def test_serve_refuses_a_bad_retention_age(tmp_path: Path, args):
    done = qlflow("serve", *args, db=f"sqlite:///{tmp_path / 'q.db'}", cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert "age" in one_error_line(done.stderr)


def test_a_pruned_log_says_so_in_logs_and_why(store_url, tmp_path: Path):
    package = write_package(tmp_path / "nightly", NIGHTLY)
    qlflow("run", str(package), "nightly", db=store_url, cwd=tmp_path)
    [run] = qlflow_json("runs", db=store_url, cwd=tmp_path)
    short = run["short_id"]
    pruned = qlflow("prune", "--logs-older-than", "1ms", db=store_url, cwd=tmp_path)
    assert pruned.returncode == 0, pruned.stderr

    logs = qlflow("logs", short, "archive", db=store_url, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    assert "the log of step archive was pruned by retention on" in logs.stderr
    why = qlflow("why", short, db=store_url, cwd=tmp_path)
    assert "its log was pruned by retention on" in why.stdout
    assert "its log is empty" not in why.stdout
