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


def paired_ratios(ours: list[dict], theirs: list[dict], key: str) -> list[float]:
    """`ours[i][key] / theirs[i][key]` for each round both measured: the rounds
    interleave the sides, so a pair met the same machine load (a ratio of medians
    hides how far one round's pair moved from another's)."""
    return [
        a[key] / b[key] for a, b in zip(ours, theirs, strict=False) if a.get(key) and b.get(key)
    ]


def ratio_line(name: str, value: float, by_round: list[float]) -> str:
    """`  name: 1.23`, with the spread of the rounds' own ratios where there are two or
    more (`(rounds 1.10–1.31)`)."""
    spread = f" (rounds {min(by_round):.2f}–{max(by_round):.2f})" if len(by_round) > 1 else ""
    return f"  {name}: {value:.2f}{spread}"
