"""Flow control: how long a Run takes from admission to its end while a backlog
drains, in lease order (docs/DESIGN.md "Flow control") against breadth-first.

    python -m bench.flow [--pg URL] [--runs 3000] [--workers 4] [--rounds 1]
                         [--sides breadth,fair,fair_limit] [--today PATH]
                         [--workloads burst,arrivals] [--sqlite-only] [--smoke]

`runs` two-step Runs (a -> b) drained by `workers` threads through the public API,
each looping `lease_attempts(limit=1, start=True)` then `complete` (the completion
commits b's claim; completions that meet share a commit, as on a host). The steps
do nothing, so what is measured is the engine's order and its cost. Two workloads:

- `burst`: every Run is admitted before the workers start (the issue's backlog).
  Whatever the order, the i-th Run to end ends at about i/N of the drain, so the
  median Run's admission-to-end is at least half the drain; breadth-first makes it
  about three quarters (every a before any b);
- `arrivals`: the Runs arrive while the workers drain, faster than they drain: a
  producer thread keeps at most 8 + 1.6 x (the Runs finished) started, a backlog
  that grows at 60% of the drain rate on any machine. Here the order decides
  whether a Run's time is its own wait or the whole backlog's.

Sides, each in a child process with its own SQLite file or PostgreSQL schema:
- `breadth`: this code, its candidate query ordered as before flow control (by the
  instant the grant window opened, then the claim's position): every Run's a
  before any b claimed after it;
- `fair`: this code as it is (lease order: priority, then the Run admitted first,
  then the claim), no limit declared;
- `fair_limit`: the same with `concurrency = 10000` on both Tasks: a limit that
  never binds, so every lease reads its slots (the cost of limits when unused is
  `fair` against this);
- `today` (with `--today PATH`): the code at PATH (a checkout from before flow
  control) running the same workload: the breadth-first order as it shipped.

`--per-call`: instead, one thread leases (`limit=1, start=True`) and completes every
Attempt of `runs` Runs admitted beforehand, and the process CPU of each call is
measured: `fair` (no limit) against `fair_limit` (limits that never bind), the
cost of a lease with limits call by call, with no other thread to share the
machine's noise with.

Per side: the drain's time (first admission to last end), Runs/s over it, the
median and p95 of each Run's admission-to-end time (the store's `admitted_at_ms`
and `terminal_at_ms`) and the median as a share of the drain, and the lease commits'
mean round trips (PostgreSQL: on the wire; SQLite: statements), and the child's own
CPU per Run (less at the mercy of a loaded machine than the wall clock; on
PostgreSQL the server's is not in it). Written to bench/results/flow.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("breadth", "fair", "fair_limit")
PACKAGE, WORKFLOW = "flowbench", "two"
NEVER_BINDS = 10_000


def manifest(limited: bool) -> dict:
    tasks: dict = {key: {"command": ["true"]} for key in ("a", "b")}
    if limited:
        for task in tasks.values():
            task["concurrency"] = NEVER_BINDS
    return {
        "package": {"name": PACKAGE, "publisher": "bench"},
        "tasks": tasks,
        "workflows": {
            WORKFLOW: {
                "steps": [{"key": "a", "task": "a"}, {"key": "b", "task": "b", "needs": ["a"]}]
            }
        },
    }


# --- the child ---------------------------------------------------------------------------


def _breadth_first() -> None:
    """Order the candidate query as before flow control (by the grant window's opening,
    then the claim's position), through the index that order had."""
    from projections import candidates

    def claimable(store_or_tx, now_ms, limit, *, run_id=None, step_key=None, tasks=None, **_):
        assert run_id is None and step_key is None and tasks is None
        rows = store_or_tx.query(
            f"""SELECT attempt_id, run_id, NULL FROM attempts
                WHERE {candidates.claimable_condition()}
                ORDER BY grant_opens_ms, claimed_position LIMIT ?""",
            (now_ms, now_ms, limit),
        )
        return [tuple(row) for row in rows]

    candidates.claimable_attempts = claimable


ARRIVAL_RATIO = 1.6  # arrivals: Runs started per Run finished
ARRIVAL_HEAD = 8  # arrivals: Runs started before any finished


def per_call(url: str, side: str, runs: int) -> dict:
    """CPU per lease and per completion of one thread draining `runs` Runs."""
    import qlflow

    rt = qlflow.open(url)
    try:
        rt.publish(manifest(side == "fair_limit"))
        for index in range(runs):
            rt.start(PACKAGE, WORKFLOW, admission_key=f"k{index}")
        lease_s = complete_s = 0.0
        for _ in range(2 * runs):
            began = time.process_time()
            [lease] = rt.lease_attempts("w", limit=1, ttl_ms=60_000, start=True)
            leased = time.process_time()
            rt.complete(lease, "succeeded")
            lease_s += leased - began
            complete_s += time.process_time() - leased
    finally:
        rt.close()
    return {
        "side": side,
        "workload": "per_call",
        "runs": runs,
        "lease_cpu_us": round(lease_s / (2 * runs) * 1e6),
        "complete_cpu_us": round(complete_s / (2 * runs) * 1e6),
    }


def child(url: str, side: str, runs: int, workers: int, workload: str) -> dict:
    import resource

    import qlflow

    if side == "breadth":
        _breadth_first()
    rt = qlflow.open(url)
    try:
        rt.publish(manifest(side == "fair_limit"))
        lease_trips: list[int] = []

        def observe(commit) -> None:
            if any(r.type == "lease.granted" for r in commit.records):
                lease_trips.append(commit.round_trips)

        rt.store.observers.on_commit(observe)
        done = threading.Event()
        completed = [0]
        lock = threading.Lock()
        errors: list[str] = []

        def produce() -> None:
            for index in range(runs):
                while workload == "arrivals" and index >= ARRIVAL_HEAD + ARRIVAL_RATIO * (
                    completed[0] // 2
                ):
                    time.sleep(0.001)
                rt.start(PACKAGE, WORKFLOW, admission_key=f"k{index}")

        def work(worker_id: str) -> None:
            try:
                while not done.is_set():
                    leases = rt.lease_attempts(worker_id, limit=1, ttl_ms=60_000, start=True)
                    if not leases:
                        time.sleep(0.001)
                        continue
                    for lease in leases:
                        rt.complete(lease, "succeeded")
                    with lock:
                        completed[0] += len(leases)
                        if completed[0] >= 2 * runs:
                            done.set()
            except Exception as error:  # reported, and the drain stops
                errors.append(f"{type(error).__name__}: {error}")
                done.set()

        if workload == "burst":
            produce()  # the backlog, before any worker starts
            threads = []
        else:
            threads = [threading.Thread(target=produce)]
        threads += [threading.Thread(target=work, args=(f"w{i}",)) for i in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError(errors[0])
        rows = rt.store.query("SELECT admitted_at_ms, terminal_at_ms, status FROM runs")
    finally:
        rt.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000
    assert len(rows) == runs and all(status == "succeeded" for _, _, status in rows), rows[:3]
    first = min(admitted for admitted, _, _ in rows)
    drain_ms = max(ended for _, ended, _ in rows) - first
    latencies = sorted(ended - admitted for admitted, ended, _ in rows)
    median = statistics.median(latencies)
    return {
        "side": side,
        "workload": workload,
        "runs": runs,
        "workers": workers,
        "drain_s": round(drain_ms / 1000, 2),
        "runs_per_s": round(runs / (drain_ms / 1000), 1),
        "median_ms": round(median),
        "p95_ms": latencies[int(0.95 * (len(latencies) - 1))],
        "median_share": round(median / drain_ms, 3),
        "lease_round_trips": round(statistics.mean(lease_trips), 2) if lease_trips else None,
        "cpu_ms_per_run": round(cpu_ms / runs, 2),  # this process's (not the server's)
    }


# --- the parent --------------------------------------------------------------------------


@contextlib.contextmanager
def place(store: str, pg_url: str | None, workdir: Path) -> Iterator[str]:
    """A fresh store for one child (dropped afterwards)."""
    if store == "sqlite":
        yield f"sqlite:///{workdir / f'flow-{uuid.uuid4().hex[:8]}.db'}"
        return
    import psycopg

    from eventstore.url import with_search_path

    assert pg_url is not None
    schema = f"bench_flow_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield with_search_path(pg_url, schema)
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def run_child(url: str, side: str, workload: str, args: argparse.Namespace) -> dict:
    code = ROOT
    if side == "today":
        code = Path(args.today).resolve()
    # this file run by path, its imports from `code` (not from bench/, whose domain.py
    # would hide the package)
    launch = (
        "import runpy, sys; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    command = [
        sys.executable, "-c", launch, str(ROOT / "bench" / "flow.py"), "--child", url, side,
        str(args.runs), str(args.workers), workload,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir()
    )
    if done.returncode != 0:
        raise SystemExit(f"{side} failed:\n{done.stdout}\n{done.stderr}")
    found = orjson.loads(done.stdout.strip().splitlines()[-1])
    found["side"] = side
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--runs", type=int, default=3_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="each side this often, interleaved")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--today", help="a checkout from before flow control: adds `today`")
    parser.add_argument("--workloads", default="burst,arrivals")
    parser.add_argument(
        "--per-call", action="store_true", help="CPU per lease and completion, one thread"
    )
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="40 Runs, 2 workers, one round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.workers, args.rounds = 40, 2, 1
    sides = [side for side in args.sides.split(",") if side]
    if args.today:
        sides.append("today")
    stores = ["sqlite"] + ([] if args.sqlite_only or not args.pg else ["postgresql"])
    results = []
    workloads = [w for w in args.workloads.split(",") if w]
    if args.per_call:
        workloads, sides = ["per_call"], ["fair", "fair_limit"]
    with tempfile.TemporaryDirectory() as folder:
        for store in stores:
            for workload in workloads:
                for _ in range(args.rounds):
                    for side in sides:
                        with place(store, args.pg, Path(folder)) as url:
                            found = run_child(url, side, workload, args)
                        found["store"] = store
                        results.append(found)
                        print(_row(found), flush=True)
    print(" | ".join(HEADER if not args.per_call else PER_CALL_HEADER))
    for found in results:
        print(_row(found))
    from bench.output import results_path

    out = results_path("flow")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"results": results}, option=orjson.OPT_INDENT_2))
    print(f"wrote {out}")
    return 0


HEADER = (
    "store", "workload", "side", "runs", "drain s", "Runs/s", "median ms", "p95 ms", "median/drain",
    "lease trips", "cpu ms/Run",
)  # fmt: skip


PER_CALL_HEADER = ("store", "workload", "side", "runs", "lease cpu us", "complete cpu us")


def _row(found: dict) -> str:
    if found.get("workload") == "per_call":
        keys = ("store", "workload", "side", "runs", "lease_cpu_us", "complete_cpu_us")
        return " | ".join(str(found.get(key)) for key in keys)
    return " | ".join(
        str(found.get(key))
        for key in (
            "store", "workload", "side", "runs", "drain_s", "runs_per_s", "median_ms", "p95_ms",
            "median_share", "lease_round_trips", "cpu_ms_per_run",
        )
    )  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, side, runs, workers, workload = sys.argv[2:7]
        if workload == "per_call":
            found = per_call(url, side, int(runs))
        else:
            found = child(url, side, int(runs), int(workers), workload)
        print(orjson.dumps(found).decode(), flush=True)
        sys.exit(0)
    sys.exit(main())
