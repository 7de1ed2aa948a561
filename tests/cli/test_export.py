"""`qlflow export` from both stores into a fresh SQLite file that sqlite-utils opens and
queries (full-text search finds a log line); `prune` deletes old logs and never an
event; sqlite-utils stays off the runtime's import path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sqlite_utils

from tests.cli.helpers import REPO, cli_env, one_error_line, qlflow, qlflow_json, write_package
from tests.cli.test_step_logs import NIGHTLY


def test_export_opens_in_sqlite_utils_with_keys_indexes_and_search(store_url, tmp_path: Path):
    nightly = write_package(tmp_path / "nightly", NIGHTLY)
    ran = qlflow(
        "run", str(nightly), "nightly", "--run-id", "nightly-1", db=store_url, cwd=tmp_path
    )
    assert ran.returncode == 1, ran.stderr
    events = qlflow_json("events", "--all", db=store_url, cwd=tmp_path)
    target = tmp_path / "audit.db"

    done = qlflow_json("export", "--to", str(target), db=store_url, cwd=tmp_path)

    assert done["tables"]["events"] == len(events)
    db = sqlite_utils.Database(target)
    assert db["events"].count == len(events)
    assert [r["run_id"] for r in db["runs"].rows] == ["nightly-1"]
    assert db["step_runs"].count == 2 and db["attempts"].count == 2
    found = list(
        db.query(
            "SELECT a.step_key, c.stream, c.text FROM log_chunks c "
            "JOIN attempts a ON a.attempt_id = c.attempt_id "
            "WHERE c.rowid IN (SELECT rowid FROM log_chunks_fts WHERE log_chunks_fts MATCH ?)",
            ['"disk on fire"'],
        )
    )
    assert found == [{"step_key": "archive", "stream": "stderr", "text": "ERROR: disk on fire\n"}]
    failed = [r["type"] for r in db["events"].search("failed", columns=["type"])]
    assert sorted(failed) == ["attempt.failed", "step.failed", "workflow.failed"]
    keys = {(fk.table, fk.column, fk.other_table) for t in db.tables for fk in t.foreign_keys}
    assert {
        ("attempts", "run_id", "runs"),
        ("log_chunks", "attempt_id", "attempts"),
        ("events", "run_id", "runs"),
    } <= keys
    assert any(index.columns == ["type"] for index in db["events"].indexes)
    assert db["events"].pks == ["global_position"]
    info = next(db["export_info"].rows)
    assert info["head_position"] == max(e["global_position"] for e in events)
    db.close()

    again = qlflow("export", "--to", str(target), db=store_url, cwd=tmp_path)
    assert again.returncode == 2 and "--replace" in one_error_line(again.stderr)
    later = qlflow_json(
        "export",
        "--to",
        str(target),
        "--since",
        "2999-01-01",
        "--replace",
        db=store_url,
        cwd=tmp_path,
    )
    assert later["tables"]["events"] == 0 and later["tables"]["runs"] == 0
    assert sqlite_utils.Database(target)["events"].count == 0


def test_prune_deletes_old_logs_and_never_an_event(store_url, tmp_path: Path):
    nightly = write_package(tmp_path / "nightly", NIGHTLY)
    assert (
        qlflow(
            "run", str(nightly), "nightly", "--run-id", "n1", db=store_url, cwd=tmp_path
        ).returncode
        == 1
    )
    events = qlflow_json("events", "--all", db=store_url, cwd=tmp_path)

    stored = qlflow_json("logs", "n1", db=store_url, cwd=tmp_path)
    kept = qlflow_json("prune", "--logs-older-than", "30d", db=store_url, cwd=tmp_path)
    assert kept["attempts"] == 0
    assert qlflow_json("logs", "n1", db=store_url, cwd=tmp_path) == stored
    gone = qlflow_json("prune", "--logs-older-than", "0s", db=store_url, cwd=tmp_path)
    assert (gone["attempts"], gone["chunks"]) == (2, len(stored))
    assert gone["bytes"] == sum(len(c["text"].encode()) for c in stored)
    assert qlflow_json("logs", "n1", db=store_url, cwd=tmp_path) == []
    assert qlflow_json("events", "--all", db=store_url, cwd=tmp_path) == events
    bad = qlflow("prune", "--logs-older-than", "soon", db=store_url, cwd=tmp_path)
    assert bad.returncode == 2 and "--logs-older-than" in one_error_line(bad.stderr)


def test_sqlite_utils_is_not_on_the_runtimes_import_path(tmp_path: Path):
    script = f"""
import sys
import qlflow, qlflow.cli
from tests.cycle.helpers import T0, manifest
rt = qlflow.open("sqlite:///{tmp_path / "q.db"}")
rt.publish(manifest([("a", [])]), now_ms=T0)
rt.start("demo", "flow", now_ms=T0)
rt.cycle(now_ms=T0 + 1)
rt.close()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("sqlite_utils", "numpy"))
print(loaded)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=cli_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
