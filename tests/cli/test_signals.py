"""Signals through the real entry point: Ctrl-C cancels `qlflow run` (a second one
exits at once), SIGTERM stops `qlflow serve` within its grace period. Every
subprocess a step started is gone afterwards."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.cli.helpers import (
    Spawned,
    copy_example,
    process_alive,
    qlflow,
    qlflow_json,
    read_pid,
    sqlite_url,
    wait_for,
    write_package,
)

STUBBORN = """
[package]
name = "stubborn"
publisher = "tests"

[tasks.hold]
command = ["python3", "hold.py"]
files = ["hold.py"]

[workflows.hold]
steps = [{ key = "hold", task = "hold" }]
"""

HOLD_PY = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a step that will not stop politely
with open(os.environ["HOLD_PID_FILE"] + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(os.environ["HOLD_PID_FILE"] + ".tmp", os.environ["HOLD_PID_FILE"])
while True:
    time.sleep(1)
"""


def test_ctrl_c_cancels_the_run_stops_the_step_and_exits_3(tmp_path: Path):
    package = copy_example("long", tmp_path)
    db = sqlite_url(tmp_path)
    pid_file = tmp_path / "work.pid"
    run = Spawned(
        "run",
        str(package),
        "long",
        "--run-id",
        "long-1",
        db=db,
        cwd=tmp_path,
        env={"LONG_PID_FILE": str(pid_file)},
    )
    try:
        pid = wait_for(lambda: read_pid(pid_file), 30, "the long step to start")
        assert process_alive(pid)

        run.process.send_signal(signal.SIGINT)
        code = run.wait(30)
    finally:
        run.kill()

    assert code == 3, run.stdout + run.stderr
    assert not process_alive(pid)
    assert "cancelling run" in run.stderr
    shown = qlflow_json("show", "long-1", db=db, cwd=tmp_path)
    assert shown["status"] == "cancelled"
    assert shown["cancel_reason"] == "user"
    work = shown["steps"]["work"]
    assert work["status"] == "cancelled"
    output = work["attempts"][0]["execution"]
    assert output["pid"] == pid
    assert output["exit_code"] == 143  # work.py exits 143 on SIGTERM
    assert output["stopped_by"] == "stop_requested"
    assert "SIGTERM" in Path(output["log_path"]).read_text()
    assert shown["steps"]["prepare"]["status"] == "succeeded"
    assert shown["steps"]["report"]["status"] == "cancelled"
    assert shown["steps"]["report"]["attempts"] == []


def test_second_ctrl_c_exits_at_once_and_kills_the_stubborn_step(tmp_path: Path):
    package = write_package(tmp_path / "stubborn", STUBBORN, {"hold.py": HOLD_PY})
    db = sqlite_url(tmp_path)
    pid_file = tmp_path / "hold.pid"
    run = Spawned(
        "run",
        str(package),
        "hold",
        "--kill-after-ms",
        "60000",  # SIGTERM is ignored; only the second Ctrl-C ends it
        db=db,
        cwd=tmp_path,
        env={"HOLD_PID_FILE": str(pid_file)},
    )
    try:
        pid = wait_for(lambda: read_pid(pid_file), 30, "the stubborn step to start")
        run.process.send_signal(signal.SIGINT)
        wait_for(lambda: "cancelling run" in run.stderr, 20, "the cancel notice")
        assert run.process.poll() is None  # still converging: the step ignores SIGTERM
        assert process_alive(pid)

        run.process.send_signal(signal.SIGINT)
        code = run.wait(10)
    finally:
        run.kill()

    assert code == 130, run.stderr
    assert "exiting without waiting" in run.stderr
    assert f"pid {pid}" in run.stderr
    assert not process_alive(pid)


def test_sigterm_stops_serve_within_its_grace_period(tmp_path: Path):
    package = copy_example("long", tmp_path)
    db = sqlite_url(tmp_path)
    pid_file = tmp_path / "work.pid"
    assert qlflow("publish", str(package), db=db, cwd=tmp_path).returncode == 0
    drain_ms, kill_after_ms = 300, 2000
    serve = Spawned(
        "serve",
        "--package-dir",
        str(package),
        "--interval-ms",
        "100",
        "--drain-ms",
        str(drain_ms),
        "--kill-after-ms",
        str(kill_after_ms),
        db=db,
        cwd=tmp_path,
        env={"LONG_PID_FILE": str(pid_file)},
        name="serve",
    )
    try:
        receipt = qlflow_json("start", "long", "long", db=db, cwd=tmp_path)
        pid = wait_for(lambda: read_pid(pid_file), 30, "serve to start the long step")

        sent = time.monotonic()
        serve.process.send_signal(signal.SIGTERM)
        code = serve.wait(30)
        took = time.monotonic() - sent
    finally:
        serve.kill()

    assert code == 0, serve.stderr
    assert took < (drain_ms + kill_after_ms) / 1000 + 3.0, took
    assert not process_alive(pid)
    assert "0 of 1 running step(s) finished within the drain, 1 stopped" in serve.stderr
    # A restart finds nothing half-done: the stopped step is recorded as the host's
    # doing (not a failure of its own), and serve's last cycle settled the Run.
    stopped = qlflow_json("show", receipt["run_id"], db=db, cwd=tmp_path)
    assert stopped["status"] == "failed"
    assert stopped["steps"]["work"]["result_code"] == "worker_shutdown"
    assert qlflow_json("why", receipt["run_id"], db=db, cwd=tmp_path)["terminal"] is True
    # Nothing runs between cycles: the next one (any host) settles the Run.
    qlflow("cycle", db=db, cwd=tmp_path)
    settled = qlflow_json("show", receipt["run_id"], db=db, cwd=tmp_path)
    work = settled["steps"]["work"]["attempts"][0]
    assert work["status"] == "failed"  # past the start barrier: recorded, never rerun
    assert work["result_code"] == "worker_shutdown"
    assert work["execution"]["stopped_by"] == "shutdown"
    assert work["execution"]["exit_code"] == 143
    assert settled["status"] == "failed"
    assert settled["steps"]["report"]["status"] == "skipped"
    assert settled["steps"]["report"]["attempts"] == []


FINISHING = """
[package]
name = "finishing"
publisher = "tests"

[tasks.work]
command = ["python3", "work.py"]
files = ["work.py"]

[workflows.flow]
steps = [{ key = "work", task = "work" }]
"""

FINISHING_PY = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda *_: None)  # would finish anyway; the host never asks
with open("work.pid.tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace("work.pid.tmp", "work.pid")
time.sleep(3)
print("done")
"""


def test_sigterm_with_a_long_drain_lets_the_step_finish_and_the_run_succeed(tmp_path: Path):
    package = write_package(tmp_path / "finishing", FINISHING, {"work.py": FINISHING_PY})
    db = sqlite_url(tmp_path)
    assert qlflow("publish", str(package), db=db, cwd=tmp_path).returncode == 0
    serve = Spawned(
        "serve",
        "--package-dir",
        str(package),
        "--interval-ms",
        "100",
        "--drain-ms",
        "60000",
        db=db,
        cwd=tmp_path,
        name="serve",
    )
    try:
        receipt = qlflow_json("start", "finishing", "flow", db=db, cwd=tmp_path)
        pid = wait_for(lambda: read_pid(package / "work.pid"), 30, "serve to start the step")
        serve.process.send_signal(signal.SIGTERM)
        code = serve.wait(60)
    finally:
        serve.kill()
    assert code == 0, serve.stderr
    assert not process_alive(pid)
    assert "no new leases; 1 running step(s) get 60000 ms to finish" in serve.stderr
    assert "1 of 1 running step(s) finished within the drain, 0 stopped" in serve.stderr
    shown = qlflow_json("show", receipt["run_id"], db=db, cwd=tmp_path)  # no cycle since
    assert shown["status"] == "succeeded", shown
    [attempt] = shown["steps"]["work"]["attempts"]
    assert (attempt["status"], attempt["execution"]["exit_code"]) == ("succeeded", 0)
    assert attempt["execution"]["stopped_by"] is None and attempt["output"] is None


def test_a_host_killed_with_sigkill_leaves_no_step_process(tmp_path: Path):
    package = copy_example("long", tmp_path)
    pid_file = tmp_path / "work.pid"
    run = Spawned(
        "run",
        str(package),
        "long",
        db=sqlite_url(tmp_path),
        cwd=tmp_path,
        env={"LONG_PID_FILE": str(pid_file)},
    )
    try:
        pid = wait_for(lambda: read_pid(pid_file), 30, "the long step to start")
        run.process.kill()  # no handler, no cleanup runs
        run.wait(10)
    finally:
        run.kill()

    wait_for(lambda: not process_alive(pid), 5, "the orphaned step to die with its host")
