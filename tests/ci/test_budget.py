"""The per-test budget is live: pytest-timeout is installed and configured, and a
test that hangs fails with its message while the run goes on to the next test."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HANGS = """
import threading

def test_hangs():
    threading.Event().wait()  # never set: only the timeout ends it

def test_after():
    pass
"""


def test_every_test_has_a_budget() -> None:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(ini["timeout"]) <= 600


def test_a_hanging_test_fails_with_the_timeout_and_the_run_goes_on(tmp_path) -> None:
    (tmp_path / "test_hang.py").write_text(HANGS)
    env = {k: v for k, v in os.environ.items() if k != "QLFLOW_FUZZ_EXAMPLES"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=1",
         str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "Timeout (>1.0s) from pytest-timeout" in done.stdout
    assert "1 failed, 1 passed" in done.stdout
