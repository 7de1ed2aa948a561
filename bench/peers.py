"""qlflow beside DBOS, the durable-workflow library a Python user would pick instead
(issue 18).

    python -m bench.peers [--pg URL] [--rounds 3] [--workflows 100] [--cancel 200]
                          [--workers 4] [--step-ms 0] [--rtt-ms 0] [--quick] [--profile]
                          [--sqlite-only] [--sides qlflow,dbos,...]

DBOS comes from the optional `[bench]` extra (`pip install -e .[bench]`); it is
never a runtime dependency. Every measurement runs in its own child process
(`python -m bench.peers --child ...`), and the rounds interleave the sides, so
both meet the same machine load. Each side keeps its shipped durability: qlflow
WAL + synchronous=FULL, DBOS its rollback journal + FULL; PostgreSQL with
`synchronous_commit=on` for both. Each child gets its own SQLite file, or its own
PostgreSQL schema (qlflow) or database (DBOS), dropped at the end.

Sides:
- `qlflow_call`: the loop the README's host writes, one public call per write:
  `cycle()`, `lease_attempts(..., limit=1024, start=True)`, then per leased Attempt
  its body and `rt.complete(lease, "succeeded")`. The headline figure (issue 34).
- `qlflow`: 100 Workflows of the 8-step DAG a -> b..g -> h started, then driven to
  completion through the public API by one in-process worker between cycles:
  `cycle()`, `lease_attempts(..., limit=64, start=True)` (or `mark_running` where
  the runtime predates it), each leased step's body in turn, `complete_many` (or a
  `complete` each where the runtime predates it). One worker is one executor slot.
- `qlflow_pool`: the main thread cycles, N worker threads of the same process each
  do the same with up to 64/N Attempts at a time.
- `qlflow_procs`: the main process cycles, N worker processes do the same; CPU is
  the sum of all the processes, RSS the largest. The workers are started, and have
  polled once, before the clock starts (replicas that are already running: a
  process's start is not what adding one buys). Also reported against `qlflow`
  (one process, one worker): `qlflow_procs_vs_one`.
- `dbos`: the same DAG as a DBOS workflow whose steps run in sequence, the 100
  workflows called one after another; `dbos_threads`: the 100 started at once
  (`DBOS.start_workflow`, DBOS's own thread per workflow).

With `--rtt-ms` every side reaches PostgreSQL through a proxy of the parent that adds
that round-trip time (PostgreSQL across a network): what a call's round trips cost.

A step's body is trivial, or sleeps `--step-ms` on every side (a step that waits on
I/O): that is where N workers running steps side by side should win.

Figures per side: workflows/s (wall, starting included), process CPU ms per
workflow, on PostgreSQL the server's CPU ms per workflow (its processes on this
machine, read from /proc; "-" when the server runs elsewhere), write transactions
per workflow (qlflow: its committed units of work; DBOS: SQLAlchemy transactions
that wrote), cancellation of 200 pending Workflows
(qlflow: admitted with their roots claimed, `cancel` each then `cycle()` until one
changes nothing; DBOS: workflows waiting in `recv`, `cancel_workflow` each) and of 200
more in one call (qlflow `cancel_many`, DBOS `cancel_workflows`), peak RSS
(VmHWM). On SQLite the qlflow child also counts WAL frames (pages) per commit in a
separate, untimed pass (a checkpoint after each commit restarts the WAL). With
--profile a qlflow round is run under cProfile and its top entries printed.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import inspect
import io
import os
import pstats
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import orjson

from bench.output import paired_ratios, ratio_line, results_path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = results_path("peers")
STEPS = [("a", []), *((k, ["a"]) for k in "bcdefg"), ("h", list("bcdefg"))]
PACKAGE, WORKFLOW = "peers", "dag"
SIDES = ("qlflow_call", "qlflow", "qlflow_pool", "qlflow_procs", "dbos", "dbos_threads")
PER_CALL_LIMIT = 1024  # the per-call loop leases whatever is claimable (README's loop)


def _manifest() -> dict:
    return {
        "package": {"name": PACKAGE, "publisher": "bench"},
        "tasks": {key: {"command": ["true"]} for key, _ in STEPS},
        "workflows": {WORKFLOW: {"steps": [{"key": k, "task": k, "needs": n} for k, n in STEPS]}},
    }


def _cpu_s(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` has used so far; None once it ended
    (or is not ours to read)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu_s(url: str) -> dict[int, float] | None:
    """CPU seconds so far of each PostgreSQL process this machine runs, by process id
    (None for SQLite, or when no server process is visible here). The sides run one
    at a time, so over a side's timed calls the growth is the server's work for that
    side, its background writers included: on one connection the client and the
    server take turns, and this is the server's part of a Workflow's time."""
    if not url.startswith("postgres"):
        return None
    found: dict[int, float] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() != "postgres":
                    continue
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        if (seconds := _proc_cpu_s(int(pid))) is not None:
            found[int(pid)] = seconds
    return found or None


def _server_ms_per_workflow(
    url: str, before: dict[int, float] | None, workflows: int
) -> float | None:
    """The server's CPU ms per Workflow since `before`: what each process alive now
    spent since then (all of it, for one started since). A process that ended in
    between is missing, so read this before the side closes its connections."""
    after = _server_cpu_s(url)
    if before is None or after is None:
        return None
    spent = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
    return spent * 1000 / workflows


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


# --- qlflow --------------------------------------------------------------------------


class _Commits:
    """Counts qlflow's committed units of work (the `<unit>.after_commit` points)."""

    def __init__(self) -> None:
        self.count = 0
        self.by_unit: dict[str, int] = {}

    def __call__(self, name: str) -> None:
        if name.endswith(".after_commit"):
            self.count += 1
            unit = name[: -len(".after_commit")]
            self.by_unit[unit] = self.by_unit.get(unit, 0) + 1


def _supports_start(rt) -> bool:
    return "start" in inspect.signature(rt.lease_attempts).parameters


PROXY: list[LatencyProxy] = []  # --rtt-ms: every child's PostgreSQL connections go through it
STEP = {"seconds": 0.0}  # a step's body: sleep this long (--step-ms), 0 for a trivial one


def _body() -> None:
    if STEP["seconds"]:
        time.sleep(STEP["seconds"])


def _work_per_call(rt, worker_id: str, limit: int = PER_CALL_LIMIT) -> int:
    """The README's loop: lease what is claimable with its start barrier, then run
    each body and `complete` it, one call per Attempt."""
    leases = rt.lease_attempts(worker_id, limit=limit, start=True)
    for lease in leases:
        _body()
        rt.complete(lease, "succeeded")
    return len(leases)


def _work_once(rt, worker_id: str, limit: int = 64) -> int:
    """Lease up to `limit` claimable Attempts, run their bodies one after another (one
    worker is one executor slot) and report them: the worker's two commits per batch
    (`complete_many`; one `complete` per step where the runtime predates it; three
    with `mark_running` before `lease_attempts(start=True)`)."""
    if _supports_start(rt):
        leases = rt.lease_attempts(worker_id, limit=limit, start=True)
    else:
        leases = rt.lease_attempts(worker_id, limit=limit)
        for lease in leases:
            rt.mark_running(lease)
    for _lease in leases:
        _body()
    if hasattr(rt, "complete_many"):
        import qlflow

        for done in rt.complete_many([qlflow.Completion(lease, "succeeded") for lease in leases]):
            assert done.error is None, done.error
    else:
        for lease in leases:
            rt.complete(lease, "succeeded")
    return len(leases)


def _open(url: str):
    import qlflow

    profile = "cluster" if url.startswith("postgresql") else "standalone"
    return qlflow.open(url=url, profile=profile)


def _all_terminal(rt, run_ids: Sequence[str]) -> bool:
    return all(rt.get_run(r).status in ("succeeded", "failed", "cancelled") for r in run_ids)


def _settled(rt, run_ids: Sequence[str]) -> bool:
    """No Run of the bench's store is still running (one query where the runtime can
    count Runs by status)."""
    if hasattr(rt, "count_runs"):
        return rt.count_runs(status="running", at_most=1) == 0
    return _all_terminal(rt, run_ids)


def _drive(
    rt,
    run_ids: list[str],
    workers: int,
    mode: str,
    batch: int = 64,
    started: Sequence[subprocess.Popen] = (),
) -> list[dict]:
    """Cycle (and, in mode `one`, work) until every Run is terminal; returns what the
    worker processes reported (their peak RSS). Each worker leases up to `batch`
    Attempts at a time; in mode `procs` the workers are the `started` processes."""
    stop = threading.Event()
    helpers: list = []
    if mode == "pool":
        for n in range(workers):
            thread = threading.Thread(target=_pool_worker, args=(rt, f"p{n}", stop, batch))
            thread.start()
            helpers.append(thread)
    elif mode == "procs":
        helpers += started
    try:
        while True:
            result = rt.cycle()
            if mode in ("one", "call"):
                # nothing changed and nothing to run: nothing ever will (no timers here);
                # the caller checks, outside the clock, that every Run succeeded
                work = _work_per_call if mode == "call" else _work_once
                if not work(rt, "w1", batch) and not result.changed:
                    break
                continue
            if not result.changed and _settled(rt, run_ids):
                break
            if not result.changed:
                time.sleep(0.001)  # let the workers take the lock
    finally:
        stop.set()
        reports = []
        for helper in helpers:
            if isinstance(helper, threading.Thread):
                helper.join()
            else:
                helper.terminate()
                stdout, _ = helper.communicate()  # waited for: its CPU joins RUSAGE_CHILDREN
                if stdout.strip():
                    reports.append(orjson.loads(stdout.strip().splitlines()[-1]))
    return reports


def _pool_worker(rt, worker_id: str, stop: threading.Event, batch: int) -> None:
    while not stop.is_set():
        if not _work_once(rt, worker_id, batch):
            time.sleep(0.001)


def _start_workers(url: str, workers: int, batch: int) -> list[subprocess.Popen]:
    """`workers` worker processes, returned once each has polled for work once."""
    helpers = []
    for n in range(workers):
        cmd = [sys.executable, "-m", "bench.peers", "--worker", url, "--worker-id", f"q{n}",
               "--batch", str(batch), "--step-ms", str(STEP["seconds"] * 1000)]  # fmt: skip
        helpers.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE))
    for helper in helpers:
        assert helper.stdout is not None
        line = helper.stdout.readline().strip()
        if line != b"ready":
            raise RuntimeError(f"a worker process did not start: {line!r}")
    return helpers


def worker_process(url: str, worker_id: str, batch: int) -> None:
    """A worker process of `qlflow_procs`: lease and complete until terminated."""
    import signal

    rt = _open(url)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    _work_once(rt, worker_id, batch)  # connected and polled: running before the clock
    ready_cpu_s = _cpu_s()
    print("ready", flush=True)
    while not stopping.is_set():
        if not _work_once(rt, worker_id, batch):
            time.sleep(0.001)
    rt.close()
    report = {"cpu_s": _cpu_s(), "ready_cpu_s": ready_cpu_s, "rss_mib": _peak_rss_mib()}
    print(orjson.dumps(report).decode(), flush=True)


def _cancel_pending(rt, cancels: int, batch: bool) -> float:
    """Cancelled/s of `cancels` pending Workflows (roots claimed, nothing leased): one
    `cancel` each, or one `cancel_many`; then cycles until one changes nothing (what
    the cancels did not converge themselves). Every Run is checked off the clock."""
    pending = [rt.start(PACKAGE, WORKFLOW).run_id for _ in range(cancels)]
    while rt.cycle().changed:
        pass
    wall0 = time.perf_counter()
    if batch:
        rt.cancel_many(pending)
    else:
        for run_id in pending:
            rt.cancel(run_id)
    while rt.cycle().changed:
        pass
    rate = cancels / (time.perf_counter() - wall0)
    assert _all_terminal(rt, pending)
    return rate


def _wal_pages(url: str, db_path: str, workflows: int) -> dict:
    """Untimed: WAL frames written by each commit of a fresh run of `workflows`."""
    from eventstore import faults

    pages: dict[str, list[int]] = {}
    side = sqlite3.connect(db_path, check_same_thread=False)

    def watcher(name: str) -> None:
        if name.endswith(".after_commit"):
            _, log_frames, _ = side.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            pages.setdefault(name[: -len(".after_commit")], []).append(log_frames)

    rt = _open(url)
    side.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    faults.watch(watcher)
    try:
        run_ids = [rt.start(PACKAGE, WORKFLOW).run_id for _ in range(workflows)]
        _drive(rt, run_ids, 1, "one")
    finally:
        faults.disarm()
        rt.close()
        side.close()
    every = [p for values in pages.values() for p in values]
    return {
        "pages_per_commit": statistics.fmean(every),
        "pages_per_workflow": sum(every) / workflows,
        "by_unit": {unit: round(statistics.fmean(v), 1) for unit, v in sorted(pages.items())},
    }


def qlflow_child(url: str, side: str, workflows: int, cancels: int, workers: int,
                 profile: bool, db_path: str | None) -> dict:  # fmt: skip
    from eventstore import faults

    mode = {"qlflow_call": "call", "qlflow": "one", "qlflow_pool": "pool",
            "qlflow_procs": "procs"}[side]  # fmt: skip
    rt = _open(url)
    rt.publish(_manifest())
    commits = _Commits()
    if mode != "procs":
        faults.watch(commits)
    profiler = cProfile.Profile() if profile else None
    batch = {"one": 64, "call": PER_CALL_LIMIT}.get(mode, max(1, 64 // workers))
    started = _start_workers(url, workers, batch) if mode == "procs" else []
    server0 = _server_cpu_s(url)
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    if profiler:
        profiler.enable()
    run_ids = [rt.start(PACKAGE, WORKFLOW).run_id for _ in range(workflows)]
    reports = _drive(rt, run_ids, workers, mode, batch, started)
    if profiler:
        profiler.disable()
    wall = time.perf_counter() - wall0
    # the worker processes' CPU from the moment each was ready
    cpu = _cpu_s() - cpu0 + sum(r["cpu_s"] - r["ready_cpu_s"] for r in reports)
    assert all(rt.get_run(r).status == "succeeded" for r in run_ids)
    out = {
        "workflows_per_s": workflows / wall,
        "cpu_ms_per_workflow": cpu * 1000 / workflows,
        # the worker processes' backends have ended by now, and /proc forgot their CPU
        "server_cpu_ms_per_workflow": None
        if mode == "procs"
        else _server_ms_per_workflow(url, server0, workflows),
        "wall_s": wall,
    }
    if mode != "procs":
        out["commits_per_workflow"] = commits.count / workflows
        out["commits_by_unit"] = {k: v / workflows for k, v in sorted(commits.by_unit.items())}
    faults.disarm()
    if profiler:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
        tottime = io.StringIO()
        pstats.Stats(profiler, stream=tottime).sort_stats("tottime").print_stats(25)
        out["profile_cumulative"] = text.getvalue()
        out["profile_tottime"] = tottime.getvalue()
    if mode in ("one", "call"):
        out["cancelled_per_s"] = _cancel_pending(rt, cancels, batch=False)
        if hasattr(rt, "cancel_many"):
            out["cancelled_batch_per_s"] = _cancel_pending(rt, cancels, batch=True)
    out["rss_mib"] = max([_peak_rss_mib(), *(r["rss_mib"] for r in reports)])
    rt.close()
    if mode == "one" and db_path is not None:
        out["wal"] = _wal_pages(url, db_path, min(workflows, 20))
    return out


# --- DBOS ----------------------------------------------------------------------------


def _count_dbos_writes() -> dict:
    """Counts SQLAlchemy transactions that wrote (any statement but a SELECT/PRAGMA)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    counts = {"writes": 0}
    dirty: set[int] = set()

    @event.listens_for(Engine, "before_cursor_execute")
    def _statement(conn, cursor, statement, parameters, context, executemany):
        head = statement.lstrip()[:6].upper()
        if head not in ("SELECT", "PRAGMA", "WITH") and not head.startswith("SET"):
            dirty.add(id(conn.connection.dbapi_connection))

    @event.listens_for(Engine, "commit")
    def _commit(conn):
        key = id(conn.connection.dbapi_connection)
        if key in dirty:
            dirty.discard(key)
            counts["writes"] += 1

    return counts


def dbos_child(url: str, side: str, workflows: int, cancels: int) -> dict:
    import logging

    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    counts = _count_dbos_writes()
    DBOS(config={"name": "peers", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.step()
    def step(key: str) -> str:
        _body()
        return key

    @DBOS.workflow()
    def dag() -> str:
        step("a")
        for key in "bcdefg":
            step(key)
        return step("h")

    @DBOS.workflow()
    def waiting() -> None:
        DBOS.recv("go", timeout_seconds=600)

    DBOS.launch()
    writes0 = counts["writes"]
    server0 = _server_cpu_s(url)
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    if side == "dbos":
        for _ in range(workflows):
            dag()
    else:
        handles = [DBOS.start_workflow(dag) for _ in range(workflows)]
        for handle in handles:
            handle.get_result()
    wall = time.perf_counter() - wall0
    cpu = _cpu_s() - cpu0
    out = {
        "workflows_per_s": workflows / wall,
        "cpu_ms_per_workflow": cpu * 1000 / workflows,
        "server_cpu_ms_per_workflow": _server_ms_per_workflow(url, server0, workflows),
        "wall_s": wall,
        "commits_per_workflow": (counts["writes"] - writes0) / workflows,
    }
    if side == "dbos":
        pending = [DBOS.start_workflow(waiting).workflow_id for _ in range(cancels)]
        wall0 = time.perf_counter()
        for workflow_id in pending:
            DBOS.cancel_workflow(workflow_id)
        out["cancelled_per_s"] = cancels / (time.perf_counter() - wall0)
        pending = [DBOS.start_workflow(waiting).workflow_id for _ in range(cancels)]
        wall0 = time.perf_counter()
        DBOS.cancel_workflows(pending)
        out["cancelled_batch_per_s"] = cancels / (time.perf_counter() - wall0)
    out["rss_mib"] = _peak_rss_mib()
    # the cancelled workflows' threads wait in recv: report and leave at once
    print(orjson.dumps(out).decode(), flush=True)
    os._exit(0)


# --- the parent ----------------------------------------------------------------------


class LatencyProxy:
    """A TCP proxy (stdlib asyncio, on a thread of the parent) that delays every chunk
    by half of `rtt_ms` each way: PostgreSQL as a replica across a network sees it.
    Order is kept per direction; bandwidth is not limited."""

    def __init__(self, host: str, port: int, rtt_ms: float) -> None:
        import asyncio

        self._target, self._delay = (host, port), rtt_ms / 2000
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        box: dict = {}

        async def start() -> None:
            box["server"] = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            ready.set()

        def run() -> None:
            self._loop.run_until_complete(start())
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)
        self._server = box["server"]
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer) -> None:
        import asyncio

        up_reader, up_writer = await asyncio.open_connection(*self._target)

        async def pump(source, sink) -> None:
            queue: asyncio.Queue = asyncio.Queue()

            async def forward() -> None:
                while True:
                    due, data = await queue.get()
                    if data is None:
                        sink.close()
                        return
                    wait = due - self._loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    sink.write(data)
                    await sink.drain()

            sender = asyncio.ensure_future(forward())
            try:
                while data := await source.read(65536):
                    queue.put_nowait((self._loop.time() + self._delay, data))
            except OSError:
                pass
            queue.put_nowait((0.0, None))
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await sender

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def via(self, url: str) -> str:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)


@contextlib.contextmanager
def _place(store: str, side: str, pg_url: str | None, workdir: Path):
    """A fresh place for one child: (url, sqlite path or None); dropped afterwards."""
    tag = uuid.uuid4().hex[:8]
    if store == "sqlite":
        path = workdir / f"{side}-{tag}.db"
        yield f"sqlite:///{path}", str(path)
        return
    import psycopg

    assert pg_url is not None
    name = f"bench_peers_{side}_{tag}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        if side.startswith("dbos"):
            base = pg_url.rsplit("/", 1)[0]
            try:
                yield f"{base}/{name}", None
            finally:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            from eventstore.url import with_search_path

            admin.execute(f'CREATE SCHEMA "{name}"')
            try:
                yield with_search_path(pg_url, name), None
            finally:
                admin.execute(f'DROP SCHEMA "{name}" CASCADE')


def _child(store: str, side: str, args, workdir: Path, profile: bool) -> dict:
    with _place(store, side, args.pg, workdir) as (url, path):
        if PROXY and store == "postgresql":
            url = PROXY[0].via(url)
        cmd = [sys.executable, "-m", "bench.peers", "--child", side, "--url", url,
               "--workflows", str(args.workflows), "--cancel", str(args.cancel),
               "--workers", str(args.workers), "--step-ms", str(args.step_ms)]  # fmt: skip
        if path:
            cmd += ["--db-path", path]
        if profile:
            cmd.append("--profile")
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{side} on {store} failed:\n{done.stderr[-3000:]}")
        return orjson.loads(done.stdout.strip().splitlines()[-1])


def _median(rounds: list[dict], key: str) -> float | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(raw: dict[str, dict[str, list[dict]]]) -> dict:
    keys = ("workflows_per_s", "cpu_ms_per_workflow", "server_cpu_ms_per_workflow",
            "commits_per_workflow",
            "cancelled_per_s", "cancelled_batch_per_s", "rss_mib")  # fmt: skip
    summary: dict = {}
    for store, sides in raw.items():
        medians = {side: {k: _median(rounds, k) for k in keys} for side, rounds in sides.items()}
        base = medians.get("dbos", {})
        ratios = {}
        by_round: dict[str, list[float]] = {}
        for side in ("qlflow_call", "qlflow", "qlflow_pool", "qlflow_procs"):
            ours = medians.get(side, {})
            if ours.get("workflows_per_s") and base.get("workflows_per_s"):
                name = f"{side}_workflows_per_s_vs_dbos"
                ratios[name] = ours["workflows_per_s"] / base["workflows_per_s"]
                by_round[name] = paired_ratios(
                    sides.get(side, []), sides.get("dbos", []), "workflows_per_s"
                )
            threads = medians.get("dbos_threads", {}).get("workflows_per_s")
            if ours.get("workflows_per_s") and threads:
                ratios[f"{side}_workflows_per_s_vs_dbos_threads"] = (
                    ours["workflows_per_s"] / threads
                )
        ours = medians.get("qlflow_call") or medians.get("qlflow", {})
        if ours.get("cpu_ms_per_workflow") and base.get("cpu_ms_per_workflow"):
            ratios["qlflow_call_cpu_vs_dbos"] = (
                ours["cpu_ms_per_workflow"] / base["cpu_ms_per_workflow"]
            )
        if ours.get("cancelled_per_s") and base.get("cancelled_per_s"):
            ratios["qlflow_cancel_vs_dbos"] = ours["cancelled_per_s"] / base["cancelled_per_s"]
            side = "qlflow_call" if medians.get("qlflow_call") else "qlflow"
            by_round["qlflow_cancel_vs_dbos"] = paired_ratios(
                sides.get(side, []), sides.get("dbos", []), "cancelled_per_s"
            )
        ours = medians.get("qlflow", {})
        if ours.get("cancelled_batch_per_s") and base.get("cancelled_batch_per_s"):
            ratios["qlflow_cancel_many_vs_dbos_cancel_workflows"] = (
                ours["cancelled_batch_per_s"] / base["cancelled_batch_per_s"]
            )
        if ours.get("cpu_ms_per_workflow") and base.get("cpu_ms_per_workflow"):
            ratios["qlflow_cpu_vs_dbos"] = ours["cpu_ms_per_workflow"] / base["cpu_ms_per_workflow"]
        procs = medians.get("qlflow_procs", {}).get("workflows_per_s")
        if procs and ours.get("workflows_per_s"):
            ratios["qlflow_procs_vs_one"] = procs / ours["workflows_per_s"]
        wal = [r["wal"] for r in sides.get("qlflow", []) if "wal" in r]
        summary[store] = {
            "medians": medians,
            "ratios": ratios,
            "ratios_by_round": by_round,
            "wal": wal[-1] if wal else None,
        }
    return summary


def render(summary: dict) -> str:
    lines = []
    for store, figures in summary.items():
        lines.append(f"== {store} (median of rounds)")
        lines.append(
            f"{'side':<14}{'wf/s':>9}{'CPU ms/wf':>11}{'server ms/wf':>14}{'commits/wf':>12}"
            f"{'cancel/s':>10}{'batch/s':>10}{'RSS MiB':>9}"
        )
        for side, m in figures["medians"].items():
            cells = [m.get(k) for k in ("workflows_per_s", "cpu_ms_per_workflow",
                     "server_cpu_ms_per_workflow", "commits_per_workflow",
                     "cancelled_per_s", "cancelled_batch_per_s", "rss_mib")]  # fmt: skip
            text = ["-" if v is None else f"{v:.1f}" for v in cells]
            lines.append(
                f"{side:<14}{text[0]:>9}{text[1]:>11}{text[2]:>14}{text[3]:>12}{text[4]:>10}"
                f"{text[5]:>10}{text[6]:>9}"
            )
        for name, value in figures["ratios"].items():
            lines.append(ratio_line(name, value, figures.get("ratios_by_round", {}).get(name, [])))
        if figures.get("wal"):
            wal = figures["wal"]
            lines.append(
                f"  WAL pages per commit: {wal['pages_per_commit']:.1f} {wal['by_unit']}; "
                f"per workflow: {wal.get('pages_per_workflow', 0):.1f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=100)
    parser.add_argument("--cancel", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--step-ms", type=float, default=0.0,
        help="each step's body sleeps this long (0: a trivial body), on both sides",
    )  # fmt: skip
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0,
        help="PostgreSQL through a proxy that adds this round-trip time, for every side",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--quick", action="store_true", help="1 round, 20 workflows, 40 cancels")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="1 round, 2 workflows, 2 cancels, 1 worker, SQLite only (a DBOS database per "
        "child on PostgreSQL takes most of a minute): does it still run",
    )
    parser.add_argument("--profile", action="store_true", help="profile one qlflow round")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--db-path", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    STEP["seconds"] = args.step_ms / 1000
    if args.worker:
        worker_process(args.worker, args.worker_id, args.batch)
        return None
    if args.child:
        if args.child.startswith("dbos"):
            out = dbos_child(args.url, args.child, args.workflows, args.cancel)
        else:
            out = qlflow_child(args.url, args.child, args.workflows, args.cancel,
                               args.workers, args.profile, args.db_path)  # fmt: skip
        print(orjson.dumps(out).decode(), flush=True)
        return None
    if args.quick:
        args.rounds, args.workflows, args.cancel = 1, 20, 40
    if args.smoke:
        args.rounds, args.workflows, args.cancel, args.workers = 1, 2, 2, 1
        args.sqlite_only = True
    stores = ["sqlite"] if args.sqlite_only or not args.pg else ["sqlite", "postgresql"]
    if args.rtt_ms and args.pg:
        from urllib.parse import urlsplit

        target = urlsplit(args.pg)
        PROXY.append(LatencyProxy(target.hostname or "127.0.0.1", target.port or 5432, args.rtt_ms))
    sides = [s for s in args.sides.split(",") if s]
    raw: dict[str, dict[str, list[dict]]] = {store: {s: [] for s in sides} for store in stores}
    profiles: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="qlflow-peers-") as tmp:
        for round_no in range(args.rounds):
            for store in stores:
                order = sides if round_no % 2 == 0 else list(reversed(sides))
                for side in order:
                    result = _child(store, side, args, Path(tmp), False)
                    raw[store][side].append(result)
                    print(f"round {round_no + 1} {store} {side}: "
                          f"{result['workflows_per_s']:.1f} wf/s", file=sys.stderr)  # fmt: skip
        if args.profile:
            for store in stores:
                profiles[store] = _child(store, "qlflow", args, Path(tmp), True)
    summary = summarise(raw)
    results = {
        "workflows": args.workflows,
        "cancel": args.cancel,
        "workers": args.workers,
        "step_ms": args.step_ms,
        "rounds": args.rounds,
        "rtt_ms": args.rtt_ms,
        "summary": summary,
        "raw": raw,
        "profiles": {
            s: {k: p[k] for k in ("profile_cumulative", "profile_tottime")}
            for s, p in profiles.items()
        },
    }
    print(render(summary))
    for store, profile in profiles.items():
        print(f"== cProfile, one qlflow round on {store} (tottime)")
        print("\n".join(profile["profile_tottime"].splitlines()[:40]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return results


if __name__ == "__main__":
    main()
