"""The dashboard's step page and live tail over a full step log (issue 21).

    python -m bench.ui_logs [--bytes 1048576] [--rounds 15] [--pg URL]

Seeding (not measured): one Run of a one-step workflow whose running Attempt has
written `--bytes` of output (80-byte lines, stdout with every fifth line on stderr)
through `Runtime.append_log`, in 4 KiB pieces a second apart as the local executor
sends them; the standalone profile's cap (1 MiB) keeps all of it. Then, through the
whole ASGI app, median of `--rounds` GETs after two warm-ups: the step page (the
last 2,000 lines), the step page with every line (`lines=all`), a live-tail poll
that finds nothing new, and one that finds the last piece's lines. The same on
PostgreSQL (a copy in a fresh schema, dropped after) with `--pg` or
QLFLOW_TEST_PG_URL. Prints a table, writes bench/results/ui_logs.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from bench.output import results_path
from bench.ui import T0, _medians

RESULTS = results_path("ui_logs")
PIECE = 4096
LINE = 80


def seed(url: str, total_bytes: int) -> dict:
    """A running Attempt with `total_bytes` of output; returns its ids and counts."""
    import qlflow

    manifest = {
        "package": {"name": "logs", "publisher": "bench"},
        "tasks": {"talk": {"command": ["true"]}},
        "workflows": {"chatty": {"steps": [{"key": "talk", "task": "talk", "needs": []}]}},
    }
    with qlflow.open(url) as rt:
        rt.publish(manifest, now_ms=T0)
        run_id = rt.start("logs", "chatty", admission_key="bench", now_ms=T0).run_id
        rt.cycle(now_ms=T0)
        (lease,) = rt.lease_attempts("bench-worker", ttl_ms=600_000, now_ms=T0)
        rt.mark_running(lease, now_ms=T0)
        lines = total_bytes // LINE
        per_piece = PIECE // LINE
        seqs = []
        for first in range(0, lines, per_piece):
            numbers = range(first, min(lines, first + per_piece))
            out = [b"%-79d\n" % n for n in numbers]
            at = T0 + 1000 * (first // per_piece + 1)
            pieces = [
                ("stderr" if n % 5 == 4 else "stdout", at, line)
                for n, line in zip(numbers, out, strict=True)
            ]
            state = rt.append_log(lease.attempt_id, pieces)
            seqs.append(state.next_seq - 1)
        return {
            "run_id": run_id,
            "attempt_id": lease.attempt_id,
            "lines": lines,
            "stored_bytes": state.stored_bytes,
            "last_seq": seqs[-1],
            "before_last_piece": seqs[-2] if len(seqs) > 1 else 0,
        }


def time_store(url: str, seeded: dict, rounds: int) -> dict:
    from starlette.testclient import TestClient

    import qlflow
    from qlflow.ui import create_app

    run_id, attempt_id = seeded["run_id"], seeded["attempt_id"]
    step = f"/runs/{run_id}/steps/talk"
    tail = f"/runs/{run_id}/attempts/{attempt_id}/log"
    variants = {
        "step page (last 2,000 lines)": (step, {}),
        "step page, every line": (step, {"lines": "all"}),
        "tail poll, nothing new": (tail, {"after": str(seeded["last_seq"])}),
        "tail poll, one piece new": (tail, {"after": str(seeded["before_last_piece"])}),
    }
    results = {}
    with qlflow.open(url) as rt:
        app = create_app(rt, token=None, allow_remote=False)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            for name, (path, params) in variants.items():
                response = client.get(path, params=params)
                assert response.status_code == 200, (name, response.text[:500])
                wall, cpu = _medians(lambda p=path, q=params: client.get(p, params=q), rounds)
                results[name] = {
                    "page_ms": wall,
                    "page_cpu_ms": cpu,
                    "lines": response.text.count('<tr class="line'),
                    "html_bytes": len(response.content),
                }
    return results


def render(results: dict, console: Console) -> None:
    stores = list(results["stores"])
    table = Table(
        title=f"step log of {results['seed']['lines']:,} lines "
        f"({results['seed']['stored_bytes']:,} bytes): median ms of {results['rounds']} "
        "(wall / CPU of this process)"
    )
    table.add_column("request")
    table.add_column("lines", justify="right")
    table.add_column("HTML bytes", justify="right")
    for store in stores:
        table.add_column(store, justify="right")
    for name, first in results["stores"][stores[0]].items():
        row = [name, f"{first['lines']:,}", f"{first['html_bytes']:,}"]
        for store in stores:
            f = results["stores"][store][name]
            row.append(f"{f['page_ms']:.0f} / {f['page_cpu_ms']:.0f}")
        table.add_row(*row)
    console.print(table)
    load = results.get("load_average_before", (0.0,))[0]
    console.print(f"load average when it started: {load:.1f} ({os.cpu_count()} cores)")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.ui_logs", description=__doc__)
    parser.add_argument("--bytes", type=int, default=1024 * 1024)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument(
        "--smoke", action="store_true", help="4 KiB of log, one round: does it still run"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.bytes, args.rounds = 4096, 1
    console = Console(width=150)
    from bench.cycle import PgSchemas

    results: dict = {"rounds": args.rounds, "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "ui_logs.db"
        results["seed"] = seeded = seed(f"sqlite:///{path}", args.bytes)
        stores = results["stores"] = {
            "sqlite": time_store(f"sqlite:///{path}", seeded, args.rounds)
        }
        if args.pg:
            schemas = PgSchemas(args.pg)
            try:
                url = schemas.clone(path, "uilogs")
                stores["postgresql"] = time_store(url, seeded, args.rounds)
            finally:
                schemas.close()
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    render(results, console)
    return results


if __name__ == "__main__":
    main()
