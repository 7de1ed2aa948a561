"""How much code one write crosses: function calls and product modules per call.

    python -m bench.crossings [--pg URL] [--label after] [--steps 8]

Counts, with `sys.setprofile`, the Python function calls made and the product
modules (files under domain/, eventstore/, projections/, actors/, qlflow/) entered
by one `rt.complete` of a step whose dependents become ready, and by one cycle
whose only work is one page: a Run past its Workflow deadline (cancellation ends
it). Counts are of code, not time: the same on every run for the same checkout, so
they compare a refactoring before and after (only public API is used, so the same
file measures an older checkout with `PYTHONPATH=<checkout>`).

Prints a table and writes bench/results/crossings-<label>.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
import psycopg
from rich.console import Console
from rich.table import Table

import qlflow
from bench.output import results_dir
from eventstore.url import with_search_path

T0 = 1_700_000_000_000
LAYERS = ("domain", "eventstore", "projections", "actors", "qlflow")


def _root_of(module_file: str) -> str:
    return str(Path(module_file).resolve().parent.parent)


class Crossings:
    """Calls and product modules entered, on every thread, while a measured call runs.

    The profile function is installed before the runtime opens (`install`), so the
    threads it starts (the SQLite operation authority, the Workflow actors) carry it
    too; it counts only while `measure` is running.
    """

    def __init__(self, root: str) -> None:
        self._prefixes = tuple(os.path.join(root, layer) + os.sep for layer in LAYERS)
        self._root = root
        self._counting = False
        self._calls = 0
        self._product_calls = 0
        self._modules: Counter[str] = Counter()

    def install(self) -> None:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)

    def uninstall(self) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not self._counting:
            return
        self._calls += 1
        filename = frame.f_code.co_filename
        if filename.startswith(self._prefixes):
            self._product_calls += 1
            self._modules[os.path.relpath(filename, self._root)] += 1

    def measure(self, call: Callable[[], Any]) -> dict[str, Any]:
        """What `call` crossed: calls, product calls, modules and layers."""
        self._calls, self._product_calls, self._modules = 0, 0, Counter()
        self._counting = True
        try:
            call()
        finally:
            self._counting = False
        layers = Counter(name.split(os.sep, 1)[0] for name in self._modules)
        return {
            "calls": self._calls,
            "product calls": self._product_calls,
            "product modules": len(self._modules),
            "layers": dict(sorted(layers.items())),
            "modules": dict(self._modules.most_common()),
        }


def _manifest(steps: int) -> str:
    """A diamond: a, then steps - 2 Steps that need a, then z that needs them all."""
    middle = [f"m{i}" for i in range(steps - 2)]
    rows = ['{ key = "a", task = "t" }']
    rows += [f'{{ key = "{key}", task = "t", needs = ["a"] }}' for key in middle]
    rows.append(f'{{ key = "z", task = "t", needs = {orjson.dumps(middle).decode()} }}')
    return (
        '[package]\nname = "cx"\npublisher = "bench"\n\n[tasks.t]\ncommand = ["true"]\n\n'
        f"[workflows.w]\ntimeout_ms = 600000\nsteps = [{', '.join(rows)}]\n"
    )


def measure(url: str, steps: int, root: str) -> dict[str, dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix="qlflow-crossings-"))
    (folder / "qlflow.toml").write_text(_manifest(steps))
    crossings = Crossings(root)
    crossings.install()
    rt = qlflow.open(url)
    try:
        rt.publish(str(folder), now_ms=T0)
        # the first of each call loads modules and fills per-process caches: warm them
        for key in ("warm", "measured"):
            rt.start("cx", "w", admission_key=f"{key}-{uuid.uuid4().hex[:8]}", now_ms=T0)
        leases = rt.lease_attempts("w1", limit=2, start=True, now_ms=T0 + 1)
        assert len(leases) == 2, leases
        rt.complete(leases[0], "succeeded", now_ms=T0 + 2)
        figures = {
            "complete (a step with dependents)": crossings.measure(
                lambda: rt.complete(leases[1], "succeeded", now_ms=T0 + 2)
            )
        }
        rt.cycle(now_ms=T0 + 3)  # nothing due: warms the cycle's phases
        figures["cycle (one page: deadline reached)"] = crossings.measure(
            lambda: rt.cycle(now_ms=T0 + 600_001)  # both Runs past their deadline
        )
        return figures
    finally:
        crossings.uninstall()
        rt.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="PostgreSQL URL (default: a SQLite file)")
    parser.add_argument("--label", default="current")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="a 3-step DAG: does it still run")
    args = parser.parse_args()
    if args.smoke:
        args.steps = 3
    root = _root_of(qlflow.__file__)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.pg or f"sqlite:///{tmp}/crossings.db"
        if args.pg:
            schema = f"bench_cx_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            url = with_search_path(args.pg, schema)
        try:
            figures = measure(url, args.steps, root)
        finally:
            if args.pg:
                with psycopg.connect(args.pg, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")
    store = "PostgreSQL" if args.pg else "SQLite"
    table = Table(title=f"Code crossed per call, {store} ({args.label})")
    for column in ("call", "calls", "product calls", "product modules", "per layer"):
        table.add_column(column, justify="left" if column in ("call", "per layer") else "right")
    for name, got in figures.items():
        layers = ", ".join(f"{k} {v}" for k, v in got["layers"].items())
        table.add_row(
            name, str(got["calls"]), str(got["product calls"]), str(got["product modules"]), layers
        )
    Console().print(table)
    out_dir = results_dir()
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"crossings-{args.label}-{store.lower()}.json"
    out.write_bytes(
        orjson.dumps(
            {"label": args.label, "store": store, "steps": args.steps, "figures": figures},
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
