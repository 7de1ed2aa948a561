"""Every bench still runs: `python -m bench.<name> --smoke` at its smallest size, on
SQLite and on PostgreSQL (QLFLOW_TEST_PG_URL), exits 0, prints its table and writes
its JSON. The figures are not looked at: they measure nothing at these sizes.

The benches are found in the folder, so a new one is covered without a change here;
a module of bench/ is either a bench (it runs as `python -m`) or a named helper.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bench.output import RESULTS_ENV

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
HELPERS = {"__init__", "output", "units"}  # imported by the benches, not run
MAIN_GUARD = re.compile(r'^if __name__ == "__main__":', re.M)
SMOKE_TIMEOUT_S = 240  # each takes seconds alone; the slowest (pg_ha) builds two clusters


def benches() -> list[str]:
    """The modules of bench/ that run as `python -m bench.<name>`."""
    return sorted(path.stem for path in BENCH.glob("*.py") if MAIN_GUARD.search(path.read_text()))


def test_every_module_is_a_bench_or_a_named_helper() -> None:
    modules = {path.stem for path in BENCH.glob("*.py")}
    assert modules - set(benches()) == HELPERS
    assert len(benches()) >= 14


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
@pytest.mark.parametrize("name", benches())
def test_the_bench_runs_at_its_smallest_size(name: str, pg_server_url: str, tmp_path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    env = {
        **os.environ,
        "QLFLOW_TEST_PG_URL": pg_server_url,
        RESULTS_ENV: str(results),
        "PYTHONPATH": str(REPO),
        "COLUMNS": "160",
    }
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--smoke"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert len(_table_lines(done.stdout)) >= 2, f"no table:\n{done.stdout}\n{done.stderr}"
    written = sorted(results.glob("*.json"))
    assert written, f"no JSON written to {results}:\n{done.stdout}"
    for path in written:
        assert orjson.loads(path.read_bytes()), f"{path.name} is empty"
    assert not list(results.glob("*.tmp"))


def _table_lines(stdout: str) -> list[str]:
    # the benches print rich tables, ` | ` rows or aligned columns: a header and a row
    return [line for line in stdout.splitlines() if line.strip()]
