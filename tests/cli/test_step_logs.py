"""Finding out what happened, through the real entry point on both stores: a failed
step's last line in `run`, `show` and `why`; `logs` by short id (followed from another
process while the step runs); the cap keeps head and tail; prefixes everywhere, and
the ambiguous one refused with its candidates."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from tests.cli.helpers import (
    Spawned,
    json_of,
    one_error_line,
    qlflow,
    qlflow_json,
    wait_for,
    write_package,
)

NIGHTLY = """
[package]
name = "backup"
publisher = "acme"

[tasks.fetch]
command = ["sh", "-c", "echo fetching; echo fetched 3 files"]

[tasks.archive]
command = ["sh", "-c", "echo archiving; echo 'ERROR: disk on fire' >&2; exit 7"]

[workflows.nightly]
steps = [{ key = "fetch", task = "fetch" },
         { key = "archive", task = "archive", needs = ["fetch"] }]
"""

TICKER = """
[package]
name = "ticker"
publisher = "tests"

[tasks.tick]
command = ["python3", "-u", "tick.py"]
files = ["tick.py"]

[workflows.tick]
steps = [{ key = "tick", task = "tick" }]
"""

TICK_PY = """
import os, time
stop = os.environ["TICK_STOP"]
n = 0
while not os.path.exists(stop):
    print(f"tick {n}")
    n += 1
    time.sleep(0.1)
print("done ticking")
"""

CHATTY = """
[package]
name = "chatty"
publisher = "tests"

[tasks.talk]
command = ["python3", "talk.py"]
files = ["talk.py"]

[workflows.talk]
steps = [{ key = "talk", task = "talk" }]
"""

TALK_PY = """
import os, sys
for i in range(int(os.environ["TALK_LINES"])):
    print(f"line {i:06d} " + "x" * 40)
sys.exit(3)
"""
LINE = len(f"line {0:06d} " + "x" * 40 + "\n")


def test_from_my_nightly_failed_to_the_failing_line_in_two_commands(store_url, tmp_path: Path):
    package = write_package(tmp_path / "nightly", NIGHTLY)

    done = qlflow("run", str(package), "nightly", db=store_url, cwd=tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "ERROR: disk on fire" in done.stdout  # the run's own report shows it
    listed = qlflow("runs", "--status", "failed", db=store_url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [run] = qlflow_json("runs", "--status", "failed", db=store_url, cwd=tmp_path)
    short = run["short_id"]
    assert (
        re.fullmatch(r"[0-9a-f]{8}", short)
        and run["run_id"] == f"run:{short}" + run["run_id"][len(short) + 4 :]
    )
    assert short in listed.stdout and run["run_id"] not in listed.stdout  # fits 80 columns

    why = qlflow("why", short, db=store_url, cwd=tmp_path)
    assert why.returncode == 0, why.stderr
    assert "step 'archive' failed (execution_failed, exit 7)" in why.stdout
    assert "| ERROR: disk on fire" in why.stdout
    shown = qlflow("show", short, db=store_url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "| ERROR: disk on fire" in shown.stdout
    assert "fetched 3 files" not in shown.stdout  # only failed steps' lines

    logs = qlflow("logs", short, "archive", db=store_url, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    assert "archiving\nERROR: disk on fire\n" in logs.stdout
    every = qlflow("logs", f"run:{short[:6]}", db=store_url, cwd=tmp_path)
    assert every.returncode == 0, every.stderr
    assert every.stdout.index("fetched 3 files") < every.stdout.index("disk on fire")
    chunks = qlflow_json("logs", short, "archive", "--attempt", "1", db=store_url, cwd=tmp_path)
    assert {(c["stream"], c["text"]) for c in chunks} == {
        ("stdout", "archiving\n"),
        ("stderr", "ERROR: disk on fire\n"),
    }
    report = qlflow_json("why", short, db=store_url, cwd=tmp_path)
    [failure] = report["failures"]
    assert (failure["step_key"], failure["result_code"], failure["exit_code"]) == (
        "archive",
        "execution_failed",
        7,
    )
    assert failure["last_lines"] == ["archiving", "ERROR: disk on fire"]


def test_prefixes_name_runs_and_an_ambiguous_one_lists_its_candidates(store_url, tmp_path):
    package = write_package(tmp_path / "nightly", NIGHTLY)
    assert qlflow("publish", str(package), db=store_url, cwd=tmp_path).returncode == 0
    for run_id in ("night-alpha", "night-beta"):
        started = qlflow(
            "start", "backup", "nightly", "--run-id", run_id, db=store_url, cwd=tmp_path
        )
        assert started.returncode == 0, started.stderr

    ambiguous = qlflow("show", "night", db=store_url, cwd=tmp_path)
    assert ambiguous.returncode == 2
    line = one_error_line(ambiguous.stderr)
    assert "more than one run id" in line and "night-alpha" in line and "night-beta" in line
    for command in (("why", "night"), ("logs", "night"), ("cancel", "night")):
        refused = qlflow(*command, db=store_url, cwd=tmp_path)
        assert refused.returncode == 2 and "night-alpha" in refused.stderr, command
    unknown = qlflow("show", "nope", db=store_url, cwd=tmp_path)
    assert unknown.returncode == 2 and "no run id is or starts with 'nope'" in unknown.stderr

    cancelled = qlflow_json("cancel", "night-a", db=store_url, cwd=tmp_path)
    assert (cancelled["run_id"], cancelled["recorded"]) == ("night-alpha", True)
    assert qlflow_json("show", "night-b", db=store_url, cwd=tmp_path)["cancel_reason"] is None
    why = qlflow("why", "night-al", db=store_url, cwd=tmp_path)
    # nothing was leased: the cancel ended the Run in its own commit
    assert why.returncode == 0 and "cancelled by user (reason user)" in why.stdout
    events = qlflow_json("events", "--run", "night-be", db=store_url, cwd=tmp_path)
    assert {e["stream_id"] for e in events} <= {"run-night-beta", "steps-night-beta"}
    nothing = qlflow("logs", "night-be", db=store_url, cwd=tmp_path)
    # its root was claimed at start: an Attempt that wrote nothing yet
    assert nothing.returncode == 0 and "wrote no output" in nothing.stderr


def test_a_running_steps_log_is_followed_from_another_process(store_url, tmp_path: Path):
    package = write_package(tmp_path / "ticker", TICKER, {"tick.py": TICK_PY})
    stop = tmp_path / "stop-ticking"
    env = {"TICK_STOP": str(stop)}
    run = Spawned(
        "run",
        str(package),
        "tick",
        "--run-id",
        "ticker-1",
        db=store_url,
        cwd=tmp_path,
        env=env,
        name="run",
    )
    follow = None
    try:
        wait_for(
            lambda: any(
                c["text"].startswith("tick ")
                for c in _json_or_empty(
                    qlflow("logs", "ticker-1", "--json", db=store_url, cwd=tmp_path)
                )
            ),
            30,
            "the first ticks in the store",
        )
        follow = Spawned(
            "logs",
            "ticker",
            "tick",
            "--follow",
            "--interval-ms",
            "100",
            db=store_url,
            cwd=tmp_path,
            name="follow",
        )
        seen = wait_for(lambda: re.findall(r"tick (\d+)", follow.stdout), 30, "ticks followed")
        wait_for(
            lambda: len(set(re.findall(r"tick (\d+)", follow.stdout)) - set(seen)) >= 3,
            30,
            "new ticks while it runs",
        )
        assert follow.process.poll() is None  # still following: the Run has not ended
        stop.touch()
        assert run.wait(30) == 0, run.stdout + run.stderr
        assert follow.wait(30) == 0, follow.stderr  # it ends by itself once the Run has
    finally:
        run.kill()
        if follow is not None:
            follow.kill()

    numbers = [int(n) for n in re.findall(r"tick (\d+)", follow.stdout)]
    assert numbers == list(range(numbers[-1] + 1))  # every tick once, in order, from 0
    assert follow.stdout.rstrip().endswith("done ticking")
    assert follow.stdout.count("==> tick, attempt 1") == 1


def test_the_log_cap_keeps_the_head_and_the_tail(store_url, tmp_path: Path):
    profile = "edge" if store_url.startswith("sqlite") else "cluster"
    cap = 64 * 1024 if profile == "edge" else 1024 * 1024
    lines = 2 * cap // LINE + 500  # about twice the cap: the middle must go
    package = write_package(tmp_path / "chatty", CHATTY, {"talk.py": TALK_PY})

    done = qlflow(
        "--profile",
        profile,
        "run",
        str(package),
        "talk",
        "--run-id",
        "talk-1",
        db=store_url,
        cwd=tmp_path,
        env={"TALK_LINES": str(lines)},
    )

    assert done.returncode == 1, done.stderr
    logs = qlflow("logs", "talk-1", db=store_url, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    text = logs.stdout
    assert "line 000000 " in text and f"line {lines - 1:06d} " in text  # head and tail
    assert f"line {lines // 2:06d} " not in text  # the middle is gone
    dropped = int(re.search(r"\[qlflow: (\d+) bytes of output dropped here", text).group(1))
    written = lines * LINE
    assert dropped == written - cap
    output = text.split("<==\n", 1)[1]
    assert len(output.encode()) - len(re.search(r"\n\[qlflow: .*?\]\n", output).group(0)) == cap
    whole_file = Path(
        json_of(qlflow("show", "talk-1", "--json", db=store_url, cwd=tmp_path))["steps"]["talk"][
            "attempts"
        ][0]["execution"]["log_path"]
    )
    assert len(whole_file.read_bytes()) == written  # the host's own file keeps everything
    why = qlflow("why", "talk-1", db=store_url, cwd=tmp_path)
    assert f"| line {lines - 1:06d} " in why.stdout  # the last lines are the tail's


def _json_or_empty(done):
    return orjson.loads(done.stdout) if done.returncode == 0 else []
