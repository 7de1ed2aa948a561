"""Step timeouts through `qlflow run` on both stores (docs/DESIGN.md, "Step
timeouts"): a step whose first Attempt runs past its `timeout_ms` is stopped by its
host (SIGTERM, then SIGKILL; a python Task's pool process likewise), recorded
`timed_out` with result code `step_timeout`, and retried by its retry policy; the
second Attempt, which returns at once, succeeds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from tests.cli.helpers import process_alive, qlflow, write_package

SLEEPY = """
import os, pathlib, time
marker = pathlib.Path(os.environ["STEP_MARKERS"]) / "first"
if not marker.exists():
    marker.write_text(str(os.getpid()))
    time.sleep(120)  # the first Attempt outlives its timeout and never stops by itself
"""

SLEEPY_FUNCTION = """
import os, pathlib, time

def run(ctx):
    marker = pathlib.Path(os.environ["STEP_MARKERS"]) / "first"
    if marker.exists():
        return {"attempt": ctx.attempt}
    marker.write_text(str(os.getpid()))
    time.sleep(120)  # deaf to ctx.stop_requested(): its pool process is ended
"""

TASKS = {
    "command": ('command = ["python3", "sleepy.py"]\nfiles = ["sleepy.py"]', "sleepy.py", SLEEPY),
    "python": ('python = "sleepy:run"\nfiles = ["sleepy.py"]', "sleepy.py", SLEEPY_FUNCTION),
}


def _package(tmp_path: Path, kind: str) -> Path:
    task, name, source = TASKS[kind]
    toml = f"""
[package]
name = "timeouts"
publisher = "tests"

[tasks.sleepy]
{task}
timeout_ms = 1000

[tasks.after]
command = ["python3", "-c", "print('after')"]

[workflows.flow]
timeout_ms = 120000
steps = [{{ key = "slow", task = "sleepy", retry = {{ max_attempts = 2, backoff_ms = 0 }} }},
         {{ key = "after", task = "after", needs = ["slow"] }}]
"""
    return write_package(tmp_path / "timeouts", toml, {name: source})


@pytest.mark.parametrize("kind", ["command", "python"])
def test_a_step_past_its_timeout_is_stopped_recorded_and_retried(store_url, tmp_path, kind):
    package = _package(tmp_path, kind)
    markers = tmp_path / "markers"
    markers.mkdir()
    began = time.monotonic()
    done = qlflow(
        "run",
        str(package),
        "flow",
        "--kill-after-ms",
        "1000",
        "--json",
        db=store_url,
        cwd=tmp_path,
        env={"STEP_MARKERS": str(markers)},
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    shown = orjson.loads(done.stdout)
    assert shown["status"] == "succeeded"
    slow = shown["steps"]["slow"]
    first, second = slow["attempts"]
    assert (first["status"], first["result_code"]) == ("timed_out", "step_timeout")
    assert first["execution"]["stopped_by"] == "step_timeout"
    assert second["status"] == "succeeded"
    assert slow["status"] == "succeeded"
    assert shown["steps"]["after"]["status"] == "succeeded"
    # stopped within its timeout, the grace and a host's round trips, not after 120 s
    assert time.monotonic() - began < 60
    first_pid = int((markers / "first").read_text())
    assert not process_alive(first_pid)
    if kind == "command":
        assert first["execution"]["signal"] in ("SIGTERM", "SIGKILL")
    assert os.path.exists(first["execution"]["log_path"])


def test_a_step_timeout_below_a_second_is_refused_at_publish_naming_the_field(tmp_path):
    package = _package(tmp_path, "command")
    toml = (package / "qlflow.toml").read_text().replace("timeout_ms = 1000", "timeout_ms = 999")
    (package / "qlflow.toml").write_text(toml)
    db = f"sqlite:///{tmp_path / 'refused.db'}"
    done = qlflow("publish", str(package), db=db, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "[tasks.sleepy] timeout_ms" in done.stderr and "1000 (1 s)" in done.stderr
    events = qlflow("events", "--json", db=db, cwd=tmp_path)
    assert events.returncode == 0 and orjson.loads(events.stdout) == []  # nothing written
