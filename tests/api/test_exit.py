"""A process that embeds qlflow exits normally without calling close(), on both
stores, and the store is closed on the way out; close() stays idempotent."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import qlflow
from tests.cycle.helpers import T0, manifest

REPO = Path(__file__).resolve().parents[2]
EXIT_DEADLINE_S = 30

SCRIPT = """
import sys
import qlflow

rt = qlflow.open(sys.argv[1])
rt.publish({manifest!r}, now_ms={t0})
rt.start("demo", "flow", now_ms={t0})
rt.cycle(now_ms={t0} + 1)
{ending}
"""


def _run_child(url: str, ending: str) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.format(manifest=manifest([("a", [])]), t0=T0, ending=ending)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), url],
        env=env,
        capture_output=True,
        text=True,
        timeout=EXIT_DEADLINE_S,  # the old authority thread kept the process forever
    )


@pytest.mark.parametrize(
    ("ending", "code"),
    [
        ("raise SystemExit(3)", 3),
        ("raise RuntimeError('the host loop broke')", 1),
        ("pass  # falls off the end", 0),
    ],
)
def test_a_process_that_never_calls_close_exits(store_url, ending, code):
    done = _run_child(store_url, ending)
    assert done.returncode == code, done.stderr
    with qlflow.open(store_url) as rt:
        [run] = rt.runs()
        attempts = rt.get_run(run.run_id).steps["a"].attempts
        assert [a.status for a in attempts] == ["claimed"]  # its work was committed


def test_the_sqlite_store_is_closed_at_exit(tmp_path: Path):
    path = tmp_path / "exit.db"
    done = _run_child(f"sqlite:///{path}", "raise SystemExit(0)")
    assert done.returncode == 0, done.stderr
    # the last connection closed cleanly: its write-ahead log was folded in and removed
    assert path.exists()
    assert not Path(f"{path}-wal").exists()


def test_close_is_idempotent_and_a_closed_runtime_refuses_calls(store_url):
    rt = qlflow.open(store_url)
    rt.close()
    rt.close()
    with pytest.raises(qlflow.errors.QlflowError, match="closed store"):
        rt.runs()
    with qlflow.open(store_url) as again:
        assert again.runs() == []
    again.close()
