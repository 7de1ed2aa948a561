"""The split deployment through the real entry point: `publish`, `start`, `cycle`
and separate `worker` processes; then `events --follow`."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson

from tests.cli.helpers import (
    Spawned,
    copy_example,
    qlflow,
    qlflow_json,
    sqlite_url,
    wait_for,
)


def test_publish_start_cycle_and_worker_processes_finish_a_run(tmp_path: Path):
    package = copy_example("nightly", tmp_path)
    db = sqlite_url(tmp_path)

    publication = qlflow_json("publish", str(package), db=db, cwd=tmp_path)
    assert publication["package"] == "backup"
    assert publication["generation"] == 1
    assert publication["created"] is True

    receipt = qlflow_json(
        "start", "backup", "nightly", "--admission-key", "nightly-1", db=db, cwd=tmp_path
    )
    assert receipt["status"] == "created"
    replay = qlflow_json(
        "start", "backup", "nightly", "--admission-key", "nightly-1", db=db, cwd=tmp_path
    )
    assert (replay["status"], replay["run_id"]) == ("existing", receipt["run_id"])
    run_id = receipt["run_id"]

    # A worker leases only Tasks of packages it has a folder for.
    other = copy_example("diamond", tmp_path)
    idle = qlflow("worker", "--once", "--package-dir", str(other), db=db, cwd=tmp_path)
    assert idle.returncode == 0, idle.stderr
    assert "0 attempt(s) run" in idle.stdout

    # the start claimed the root; fetch's completion claims archive in its own commit:
    # the cycle's attempt admission has nothing left to do
    for _ in range(2):
        cycled = qlflow_json("cycle", db=db, cwd=tmp_path)
        admitted = (cycled["claim"]["scanned"], cycled["claim"]["changed"])
        assert admitted == (0, 0)
        worked = qlflow(
            "worker",
            "--once",
            "--id",
            "w-test",
            "--package-dir",
            str(package),
            db=db,
            cwd=tmp_path,
        )
        assert worked.returncode == 0, worked.stderr
        assert "1 attempt(s) run" in worked.stdout

    qlflow("cycle", db=db, cwd=tmp_path)
    shown = qlflow_json("show", run_id, db=db, cwd=tmp_path)
    assert shown["status"] == "succeeded"
    for step in ("fetch", "archive"):
        attempt = shown["steps"][step]["attempts"][0]
        assert (attempt["status"], attempt["worker_id"]) == ("succeeded", "w-test")

    follow = Spawned(
        "events",
        "--run",
        run_id,
        "--follow",
        "--json",
        "--interval-ms",
        "50",
        db=db,
        cwd=tmp_path,
        name="follow",
    )
    try:
        wait_for(lambda: "workflow.succeeded" in follow.stdout, 20, "the followed events")
        follow.process.send_signal(signal.SIGINT)
        assert follow.wait(10) == 0, follow.stderr
    finally:
        follow.kill()
    lines = [orjson.loads(line) for line in follow.stdout.splitlines()]
    assert lines[0]["type"] == "workflow.admitted"
    assert "workflow.succeeded" in [line["type"] for line in lines]
    positions = [line["global_position"] for line in lines]
    assert positions == sorted(set(positions))
