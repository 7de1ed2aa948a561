"""Python Tasks: qlflow's engine overhead per python step beside DBOS's `@DBOS.step`.

    python -m bench.python_tasks [--pg URL] [--rounds 3] [--workflows 100] [--slots 8]
                                 [--quick] [--sqlite-only] [--sides ...]

The same 8-step DAG (a -> b..g -> h) of functions that return at once:
- `qlflow_thread` / `qlflow_process`: a package of python Tasks (`isolation =
  "thread"` / `"process"`), the Workflows started, then run to their end by one
  `qlflow.Worker` (`slots` steps at once) that also cycles — everything but the
  function body is engine overhead. The pool processes are started before the
  clock (a host starts them once); their CPU is counted with the host's.
- `dbos`: the DAG as a DBOS workflow of `@DBOS.step` functions called in turn, the
  Workflows one after another; `dbos_threads`: all started at once.
Figures: workflows/s (wall, starts included), CPU ms per workflow, on PostgreSQL the
server's CPU ms per workflow (`bench.peers._server_cpu_s`), peak RSS.

`--parallel`: the host side of "4 python steps that each wait 50 ms": a Workflow of
4 independent steps each sleeping 50 ms (`--parallel-workflows` of them, 40 by
default: long enough that the ramp at either end weighs little), run by a Worker of
4 slots and of 1 slot
(thread and process isolation); the ratio of their workflows/s, with the starts
(what the ratio must carry) and without them (`_drain_only`: the Runs admitted before
the clock, the steps alone).

Every measurement runs in its own child process with its own SQLite file or
PostgreSQL schema/database (`bench.peers` places them); DBOS comes from the
optional `[bench]` extra. Results are written to bench/results/python_tasks.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from bench.output import paired_ratios, ratio_line, results_path
from bench.peers import (
    STEPS,
    _cpu_s,
    _peak_rss_mib,
    _place,
    _proc_cpu_s,
    _server_cpu_s,
    _server_ms_per_workflow,
)

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("qlflow_thread", "qlflow_process", "dbos", "dbos_threads")
PARALLEL_SIDES = ("parallel_thread", "parallel_process")
PACKAGE = "pybench"


def _package(folder: Path, isolation: str, parallel: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "steps.py").write_text(
        "import time\n\ndef step(ctx):\n    return None\n\n"
        "def wait(ctx):\n    time.sleep(0.05)\n    return None\n"
    )
    if parallel:
        steps = [(key, []) for key in "abcd"]
        function = "wait"
    else:
        steps, function = STEPS, "step"
    tasks = "".join(
        f'[tasks.{key}]\npython = "steps:{function}"\nfiles = ["steps.py"]\n'
        f'isolation = "{isolation}"\n'
        for key, _ in steps
    )
    flow = ", ".join(
        f'{{key = "{key}", task = "{key}", needs = {orjson.dumps(needs).decode()}}}'
        for key, needs in steps
    )
    (folder / "qlflow.toml").write_text(
        f'[package]\nname = "{PACKAGE}"\npublisher = "bench"\n{tasks}'
        f"[workflows.dag]\nsteps = [{flow}]\n"
    )
    return folder


def qlflow_child(url: str, side: str, workflows: int, slots: int, workdir: Path) -> dict:
    import qlflow

    parallel = side.startswith("parallel")
    isolation = "thread" if side.endswith("thread") else "process"
    folder = _package(workdir / f"pkg-{os.getpid()}", isolation, parallel)
    profile = "cluster" if url.startswith("postgresql") else "standalone"
    rt = qlflow.open(url=url, profile=profile)
    rt.publish(folder)
    worker = qlflow.Worker(rt, [folder], slots=slots, log_dir=workdir / "logs")
    pool = worker.executor.python.pool
    if isolation == "process":
        pool.start()  # a host starts its pool once, before any step
    pool_pids = [p.pid for p in pool._idle]
    pool_cpu0 = sum(_proc_cpu_s(pid) or 0.0 for pid in pool_pids)
    server0 = _server_cpu_s(url)
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    run_ids = [rt.start(PACKAGE, "dag").run_id for _ in range(workflows)]
    drain0 = time.perf_counter()
    worker.work(
        lambda: rt.count_runs(status="running", at_most=1) == 0, cycle=True, interval_s=0.25
    )  # fmt: skip  (a finished step wakes it at once)
    end = time.perf_counter()
    wall, drain = end - wall0, end - drain0
    cpu = _cpu_s() - cpu0 + sum(_proc_cpu_s(pid) or 0.0 for pid in pool_pids) - pool_cpu0
    server_ms = _server_ms_per_workflow(url, server0, workflows)
    statuses = {rt.get_run(run_id).status for run_id in run_ids}
    assert statuses == {"succeeded"}, statuses
    out = {
        "workflows_per_s": workflows / wall,
        "drain_workflows_per_s": workflows / drain,  # the starts left out
        "cpu_ms_per_workflow": cpu * 1000 / workflows,
        "server_cpu_ms_per_workflow": server_ms,
        "wall_s": wall,
        "rss_mib": _peak_rss_mib(),
        "pool_processes": len(pool_pids),
    }
    worker.close()
    rt.close()
    return out


def dbos_child(url: str, side: str, workflows: int) -> dict:
    import logging

    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(config={"name": "pysteps", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.step()
    def step(key: str) -> None:
        return None

    @DBOS.workflow()
    def dag() -> None:
        step("a")
        for key in "bcdefg":
            step(key)
        step("h")

    DBOS.launch()
    server0 = _server_cpu_s(url)
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    if side == "dbos":
        for _ in range(workflows):
            dag()
    else:
        for handle in [DBOS.start_workflow(dag) for _ in range(workflows)]:
            handle.get_result()
    wall = time.perf_counter() - wall0
    cpu = _cpu_s() - cpu0
    out = {
        "workflows_per_s": workflows / wall,
        "cpu_ms_per_workflow": cpu * 1000 / workflows,
        "server_cpu_ms_per_workflow": _server_ms_per_workflow(url, server0, workflows),
        "wall_s": wall,
        "rss_mib": _peak_rss_mib(),
    }
    print(orjson.dumps(out).decode(), flush=True)
    os._exit(0)


def _child(store: str, side: str, args, workdir: Path, slots: int, workflows: int) -> dict:
    with _place(store, side, args.pg, workdir) as (url, _path):
        cmd = [sys.executable, "-m", "bench.python_tasks", "--child", side, "--url", url,
               "--workflows", str(workflows), "--slots", str(slots),
               "--workdir", str(workdir)]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{side} on {store} failed:\n{done.stderr[-3000:]}")
        return orjson.loads(done.stdout.strip().splitlines()[-1])


def _median(rounds: list[dict], key: str) -> float | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(raw: dict) -> dict:
    summary: dict = {}
    for store, sides in raw.items():
        medians = {
            side: {k: _median(rounds, k) for k in ("workflows_per_s", "drain_workflows_per_s",
                                                   "cpu_ms_per_workflow",
                                                   "server_cpu_ms_per_workflow", "rss_mib")}
            for side, rounds in sides.items()
        }  # fmt: skip
        ratios = {}
        by_round: dict[str, list[float]] = {}
        for ours in ("qlflow_thread", "qlflow_process"):
            for theirs in ("dbos", "dbos_threads"):  # both sides' figures include the starts
                a = medians.get(ours, {}).get("workflows_per_s")
                b = medians.get(theirs, {}).get("workflows_per_s")
                if a and b:
                    ratios[f"{ours}_vs_{theirs}"] = a / b
                    by_round[f"{ours}_vs_{theirs}"] = paired_ratios(
                        sides.get(ours, []), sides.get(theirs, []), "workflows_per_s"
                    )
        for isolation in ("thread", "process"):
            four = medians.get(f"parallel_{isolation}/4", {}).get("workflows_per_s")
            one = medians.get(f"parallel_{isolation}/1", {}).get("workflows_per_s")
            rounds4 = sides.get(f"parallel_{isolation}/4", [])
            rounds1 = sides.get(f"parallel_{isolation}/1", [])
            if four and one:
                ratios[f"parallel_{isolation}_4_slots_vs_1"] = four / one
                by_round[f"parallel_{isolation}_4_slots_vs_1"] = paired_ratios(
                    rounds4, rounds1, "workflows_per_s"
                )
            four = medians.get(f"parallel_{isolation}/4", {}).get("drain_workflows_per_s")
            one = medians.get(f"parallel_{isolation}/1", {}).get("drain_workflows_per_s")
            if four and one:  # the steps alone: the Runs admitted before the clock
                ratios[f"parallel_{isolation}_4_slots_vs_1_drain_only"] = four / one
                by_round[f"parallel_{isolation}_4_slots_vs_1_drain_only"] = paired_ratios(
                    rounds4, rounds1, "drain_workflows_per_s"
                )
        summary[store] = {"medians": medians, "ratios": ratios, "ratios_by_round": by_round}
    return summary


def render(summary: dict) -> str:
    lines = []
    for store, figures in summary.items():
        lines.append(f"== {store} (median of rounds)")
        lines.append(f"{'side':<22}{'wf/s':>9}{'CPU ms/wf':>11}{'server ms/wf':>14}{'RSS MiB':>9}")
        for side, m in figures["medians"].items():
            cells = [m.get(k) for k in ("workflows_per_s", "cpu_ms_per_workflow",
                     "server_cpu_ms_per_workflow", "rss_mib")]  # fmt: skip
            text = ["-" if v is None else f"{v:.1f}" for v in cells]
            lines.append(f"{side:<22}{text[0]:>9}{text[1]:>11}{text[2]:>14}{text[3]:>9}")
        for name, value in figures["ratios"].items():
            lines.append(ratio_line(name, value, figures["ratios_by_round"].get(name, [])))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=100)
    parser.add_argument("--slots", type=int, default=8)
    # 40: a throughput in steady state; with 10 the last wave's stagger and the first
    # fill weigh a tenth of the 4-slot side's wall (SQLite thread 3.36x at 10, 3.60x at 40)
    parser.add_argument("--parallel-workflows", type=int, default=40)
    parser.add_argument("--sides", default=",".join(SIDES + PARALLEL_SIDES))
    parser.add_argument("--quick", action="store_true", help="1 round, 20 workflows")
    parser.add_argument(
        "--smoke", action="store_true", help="the smallest run: it checks, measures nothing"
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child.startswith("dbos"):
            dbos_child(args.url, args.child, args.workflows)
        out = qlflow_child(args.url, args.child, args.workflows, args.slots, Path(args.workdir))
        print(orjson.dumps(out).decode(), flush=True)
        return None
    if args.quick:
        args.rounds, args.workflows, args.parallel_workflows = 1, 20, 5
    if args.smoke:
        args.rounds, args.workflows, args.parallel_workflows = 1, 2, 1
        args.sides = "qlflow_thread,qlflow_process,dbos,parallel_thread"
    stores = ["sqlite"] if args.sqlite_only or not args.pg else ["sqlite", "postgresql"]
    sides = [s for s in args.sides.split(",") if s]
    raw: dict[str, dict[str, list[dict]]] = {store: {} for store in stores}
    with tempfile.TemporaryDirectory(prefix="qlflow-pytasks-") as tmp:
        for round_no in range(args.rounds):
            for store in stores:
                order = sides if round_no % 2 == 0 else list(reversed(sides))
                for side in order:
                    runs = (
                        [(f"{side}/4", 4), (f"{side}/1", 1)]
                        if side in PARALLEL_SIDES
                        else [(side, args.slots)]
                    )
                    for name, slots in runs:
                        count = args.parallel_workflows if side in PARALLEL_SIDES else (
                            args.workflows)  # fmt: skip
                        result = _child(store, side, args, Path(tmp), slots, count)
                        raw[store].setdefault(name, []).append(result)
                        print(f"round {round_no + 1} {store} {name}: "
                              f"{result['workflows_per_s']:.1f} wf/s", file=sys.stderr)  # fmt: skip
    summary = summarise(raw)
    results = {
        "workflows": args.workflows,
        "slots": args.slots,
        "rounds": args.rounds,
        "summary": summary,
        "raw": raw,
    }
    print(render(summary))
    out = Path(args.out) if args.out else results_path("python_tasks")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return results


if __name__ == "__main__":
    main()
