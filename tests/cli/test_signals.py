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


RESUMABLE = """
[package]
name = "resumable"
publisher = "tests"

[tasks.work]
command = ["python3", "work.py"]
files = ["work.py"]
{on_interrupt}

[tasks.report]
command = ["python3", "-c", "print('reported')"]

[workflows.flow]
steps = [{{ key = "work", task = "work" }}, {{ key = "report", task = "report", needs = ["work"] }}]
"""

RESUMABLE_PY = """
import os, pathlib, time
runs = pathlib.Path("runs.txt")
runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
with open("work.pid.tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace("work.pid.tmp", "work.pid")
if len(runs.read_text()) == 1:
    time.sleep(600)  # the first time it outlives the drain; SIGTERM ends it (exit -15)
print("done")
"""


def _serve(package: Path, db: str, tmp_path: Path, name: str, drain_ms: int = 300) -> Spawned:
    return Spawned(
        "serve", "--package-dir", str(package), "--interval-ms", "100",
        "--drain-ms", str(drain_ms), "--kill-after-ms", "2000",
        db=db, cwd=tmp_path, name=name,
    )  # fmt: skip


def _stop(serve: Spawned, pid: int, drain_ms: int = 300) -> float:
    sent = time.monotonic()
    serve.process.send_signal(signal.SIGTERM)
    try:
        assert serve.wait(30) == 0, serve.stderr
    finally:
        serve.kill()
    took = time.monotonic() - sent
    assert not process_alive(pid)
    return took


def test_sigterm_interrupts_a_step_and_a_restarted_serve_finishes_the_run(tmp_path: Path):
    package = write_package(
        tmp_path / "resumable", RESUMABLE.format(on_interrupt=""), {"work.py": RESUMABLE_PY}
    )
    db = sqlite_url(tmp_path)
    assert qlflow("publish", str(package), db=db, cwd=tmp_path).returncode == 0
    serve = _serve(package, db, tmp_path, "serve")
    try:
        receipt = qlflow_json("start", "resumable", "flow", db=db, cwd=tmp_path)
        pid = wait_for(lambda: read_pid(package / "work.pid"), 30, "serve to start the step")
    finally:
        took = _stop(serve, pid)
    assert took < (300 + 2000) / 1000 + 3.0, took
    assert "0 of 1 running step(s) finished within the drain, 1 stopped" in serve.stderr
    # The stop was the host's doing: the step waits to run again, no attempt used up.
    stopped = qlflow_json("show", receipt["run_id"], db=db, cwd=tmp_path)
    assert stopped["status"] == "running"
    work = stopped["steps"]["work"]
    assert work["status"] == "ready"
    first = work["attempts"][0]
    assert (first["status"], first["result_code"]) == ("interrupted", "worker_shutdown")
    assert first["execution"]["stopped_by"] == "shutdown"
    why = qlflow("why", receipt["run_id"], db=db, cwd=tmp_path)
    assert "interrupted by a host shutdown, will run again" in why.stdout, why.stdout
    events = qlflow_json(
        "events", f"--run={receipt['run_id']}", "--type=attempt.interrupted", db=db, cwd=tmp_path
    )
    assert [e["type"] for e in events] == ["attempt.interrupted"]  # an event of its own

    again = _serve(package, db, tmp_path, "serve-again")
    try:
        done = wait_for(
            lambda: (
                view
                if (view := qlflow_json("show", receipt["run_id"], db=db, cwd=tmp_path))["status"]
                != "running"
                else None
            ),
            60,
            "the restarted serve to finish the Run",
        )
    finally:
        _stop(again, read_pid(package / "work.pid") or 0)
    assert done["status"] == "succeeded", done
    attempts = done["steps"]["work"]["attempts"]
    assert [a["status"] for a in attempts] == ["interrupted", "succeeded"]
    assert (package / "runs.txt").read_text() == "xx"  # twice, each time recorded
    assert done["steps"]["report"]["status"] == "succeeded"


def test_a_task_that_says_a_stop_is_a_failure_fails(tmp_path: Path):
    package = write_package(
        tmp_path / "resumable",
        RESUMABLE.format(on_interrupt='on_interrupt = "fail"'),
        {"work.py": RESUMABLE_PY},
    )
    db = sqlite_url(tmp_path)
    assert qlflow("publish", str(package), db=db, cwd=tmp_path).returncode == 0
    serve = _serve(package, db, tmp_path, "serve")
    try:
        receipt = qlflow_json("start", "resumable", "flow", db=db, cwd=tmp_path)
        pid = wait_for(lambda: read_pid(package / "work.pid"), 30, "serve to start the step")
    finally:
        _stop(serve, pid)
    qlflow("cycle", db=db, cwd=tmp_path)
    settled = qlflow_json("show", receipt["run_id"], db=db, cwd=tmp_path)
    work = settled["steps"]["work"]["attempts"][0]
    assert (work["status"], work["result_code"]) == ("failed", "worker_shutdown")
    assert settled["status"] == "failed"
    assert settled["steps"]["report"]["status"] == "skipped"


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
