"""Where a bench writes its JSON: bench/results/, or the folder QLFLOW_BENCH_RESULTS
names (the smoke test's own folder, so a `--smoke` run in CI never overwrites a
measurement)."""

from __future__ import annotations

import os
from pathlib import Path

RESULTS_ENV = "QLFLOW_BENCH_RESULTS"


def results_dir() -> Path:
    """The folder every bench writes its results to."""
    chosen = os.environ.get(RESULTS_ENV)
    return Path(chosen) if chosen else Path(__file__).resolve().parent / "results"


def results_path(name: str) -> Path:
    """The JSON file of bench `name` (`python -m bench.<name>`)."""
    return results_dir() / f"{name}.json"
