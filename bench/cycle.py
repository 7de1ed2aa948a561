"""The caller-driven cycle, measured (issue 5).

    python -m bench.cycle [--pg URL] [--quick | --smoke] [--profile]

1. Cancellation convergence: N Workflows x 8 steps in mixed states (not started,
   claimed, leased, running; user cancel or deadline passed), converged by
   `cycle()` (standalone / cluster profile) while a scripted worker finishes the
   Attempts it holds between cycles. Figure: Workflows settled per second of
   cycle time; beside it the worker's time (it marks running and completes every
   held Attempt, and the completion of a Run's last held Attempt ends that Run) and
   how many Runs such completions ended.
2. One cycle over 100 fresh candidates (Runs with cancel intent) in a store with
   100 vs 100,000 dormant Runs (one-step Runs waiting on a running worker, or
   terminal). Figure: ratio of the median cycle times.
3. Write-lock hold per Workflow on SQLite with synchronous=FULL (a page's Workflows
   share one unit: its hold over the Workflows it wrote), taken
   during 1. from the fault points around `actors.authority.run_unit`
   (`<phase>.after_begin` to `<phase>.after_commit`), split into the work before
   COMMIT and the COMMIT itself; the disk's raw fsync latency is measured in the
   same run for reference, and a third copy of 1. is converged with
   synchronous=NORMAL (no fsync per COMMIT) to show the disk's share.
4. The same pages with Workflow actors vs a plain loop deciding each page's turns
   in turn on the calling thread (`actors.workflow.decide_turn`), committed as the
   actors' are: two identical copies of the 1. store converged cycle by cycle,
   interleaved.
5. Peak RSS (VmHWM) of a child process with the edge profile converging 1,000
   Workflows of the 1. mix, and of a child that only opens the runtime.

Seeding is not measured. It goes through the same units of work the API runs
(admission, the admission/frontier phase, lease, mark_running, complete,
cancel), many to one transaction on a SQLite file with synchronous=OFF; the
decoded publication revision is memoised while seeding (a publication is
immutable; the records are byte-identical). Each comparison then works on exact
copies: SQLite by the backup API, PostgreSQL by COPYing the same rows into a
fresh schema (position counter set to the last position, VACUUM ANALYZE), so
both dialects converge the very same state. Schemas are dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

import qlflow
from actors import supervisor, workers
from actors.authority import LocalUnits
from actors.loading import read_runs
from actors.run_writes import RunWrite, write_runs
from actors.supervisor import commit_page
from actors.workflow import WorkflowOutcome, decide_turn, prepare
from bench.output import results_path
from bench.units import InTransaction
from domain.cancellation import request_cancel
from domain.phases import RUN_PHASES
from eventstore import faults
from eventstore.url import with_search_path
from projections import candidates

RESULTS = results_path("cycle")
ROOT = Path(__file__).resolve().parents[1]

T0 = 1_700_000_000_000
CANCEL_AT = T0 + 1_000
TIMEOUT_MS = 60_000
CONVERGE_AT = T0 + 120_000  # past every timed Run's deadline


def converge(units, run_id: str, phase: str, now_ms: int) -> WorkflowOutcome:
    """One Run's turn for `phase` on the calling thread, without an actor: a page of one."""
    return commit_page(units, [prepare(units, run_id, phase, now_ms)], phase)[0]


LEASE_TTL_MS = 600_000  # no lease expires while the bench converges
CYCLE_STEP_MS = 10
COMPLETION_WAVES = 20  # held Attempts finish over this many cycles
SEED_BATCH = 250  # Runs seeded per transaction
CANDIDATES = 100
SMALL_DORMANT = 100

PACKAGE = "bench"
DORMANT_PACKAGE = "dormant"
ROOTS = ("a", "b", "c", "d")
STEPS = [(key, []) for key in ROOTS] + [
    (child, [root]) for child, root in zip("efgh", ROOTS, strict=True)
]

TARGETS = {
    "settled_per_s": 1_000,  # both stores (issue 34; issue 5 asked it of SQLite)
    "dormant_ratio": 1.2,
    "lock_hold_p95_ms": 1.0,
    "actor_overhead": 0.20,
    "edge_rss_mib": 48,
}


@dataclass(frozen=True, slots=True)
class Sizes:
    workflows: int
    dormant: int
    rss_workflows: int
    dormant_rounds: int


FULL = Sizes(workflows=10_000, dormant=100_000, rss_workflows=1_000, dormant_rounds=7)
QUICK = Sizes(workflows=500, dormant=2_000, rss_workflows=300, dormant_rounds=3)
SMOKE = Sizes(workflows=24, dormant=200, rss_workflows=16, dormant_rounds=1)  # does it run


# --- manifests ------------------------------------------------------------------


def _manifest(package: str, steps, workflows: dict[str, int | None]) -> dict:
    """One task per step key; one workflow per entry (name -> timeout_ms or None)."""
    tables = {}
    for name, timeout_ms in workflows.items():
        table: dict = {"steps": [{"key": k, "task": k, "needs": list(n)} for k, n in steps]}
        if timeout_ms is not None:
            table["timeout_ms"] = timeout_ms
        tables[name] = table
    return {
        "package": {"name": package, "publisher": "bench"},
        "tasks": {key: {"command": ["true"]} for key, _ in steps},
        "workflows": tables,
    }


WORKFLOW_MANIFEST = _manifest(PACKAGE, STEPS, {"flow": None, "flow_timed": TIMEOUT_MS})
DORMANT_MANIFEST = _manifest(DORMANT_PACKAGE, [("solo", [])], {"solo": None})


# --- seeding ----------------------------------------------------------------------


@contextlib.contextmanager
def _memoised_revisions() -> Iterator[None]:
    from actors import admission

    original = admission.published_revision
    cache: dict[str, tuple] = {}

    def published_revision(tx, publication_id: str):
        if publication_id not in cache:
            cache[publication_id] = original(tx, publication_id)
        return cache[publication_id]

    admission.published_revision = published_revision
    try:
        yield
    finally:
        admission.published_revision = original


@dataclass(frozen=True, slots=True)
class Held:
    """An Attempt a worker holds when the cancel arrives; it finishes later."""

    lease: workers.Lease
    started: bool


def _lease_one(auth, run_id: str, step_key: str) -> workers.Lease:
    (lease,) = workers.lease_attempts(
        auth,
        "seed-worker",
        limit=1,
        ttl_ms=LEASE_TTL_MS,
        now_ms=T0,
        run_id=run_id,
        step_key=step_key,
    )
    return lease


def _seed_workflow(auth, i: int) -> list[Held]:
    """Workflow `i` in one of eight mixed states (kind = i % 8):
    0-3 four roots claimed (at their start), 4 two roots leased (not started),
    5/6 a succeeded, e claimed, b running, c leased, d claimed, 7 four roots
    running. Odd kinds 1, 3 and the kind 6 are timed (their deadline passes),
    the others get a user cancel."""
    from actors import admission

    kind = i % 8
    timed = kind in (1, 3, 6)
    receipt = admission.start(
        auth,
        PACKAGE,
        "flow_timed" if timed else "flow",
        admission_key=f"wf-{i:06d}",
        now_ms=T0,
    )
    run_id = receipt.run_id
    held: list[Held] = []
    if kind >= 2:
        converge(auth, run_id, "claim", T0)
    if kind == 4:
        held += [Held(_lease_one(auth, run_id, key), False) for key in ("a", "b")]
    elif kind in (5, 6):
        first = _lease_one(auth, run_id, "a")
        workers.mark_running(auth, first, T0)
        workers.complete(auth, first, "succeeded", result_code=None, output=None, now_ms=T0)
        converge(auth, run_id, "frontier", T0)
        converge(auth, run_id, "claim", T0)
        running = _lease_one(auth, run_id, "b")
        workers.mark_running(auth, running, T0)
        held += [Held(running, True), Held(_lease_one(auth, run_id, "c"), False)]
    elif kind == 7:
        for key in ROOTS:
            lease = _lease_one(auth, run_id, key)
            workers.mark_running(auth, lease, T0)
            held.append(Held(lease, True))
    if not timed:
        # the intent alone (a cancel would end at once what no worker holds): the
        # cycle's cancellation phase is what this bench measures
        write = RunWrite(run_id, lambda agg: request_cancel(agg, "user", CANCEL_AT))
        auth.execute(lambda tx: write_runs(tx, [write], None, wait=True), name="cancel")
    return held


def seed_cancellation(path: Path, workflows: int) -> list[Held]:
    """A SQLite file with `workflows` Runs of the mixed cancellation scenario."""
    held: list[Held] = []
    with qlflow.open(f"sqlite:///{path}", synchronous="OFF") as rt, _memoised_revisions():
        rt.publish(WORKFLOW_MANIFEST, now_ms=T0)
        for start in range(0, workflows, SEED_BATCH):
            with rt.store.transaction() as tx:
                auth = InTransaction(tx)
                for i in range(start, min(workflows, start + SEED_BATCH)):
                    held += _seed_workflow(auth, i)
    return held


def seed_dormant(path: Path, dormant: int) -> None:
    """A SQLite file with `dormant` one-step Runs, half waiting on a running worker,
    half succeeded, and the 8-step package published for fresh candidates."""
    from actors import admission

    with qlflow.open(f"sqlite:///{path}", synchronous="OFF") as rt, _memoised_revisions():
        rt.publish(WORKFLOW_MANIFEST, now_ms=T0)
        rt.publish(DORMANT_MANIFEST, now_ms=T0)
        for start in range(0, dormant, SEED_BATCH):
            with rt.store.transaction() as tx:
                auth = InTransaction(tx)
                run_ids = [
                    admission.start(
                        auth, DORMANT_PACKAGE, "solo", admission_key=f"dorm-{i:07d}", now_ms=T0
                    ).run_id
                    for i in range(start, min(dormant, start + SEED_BATCH))
                ]
                for run_id in run_ids:
                    converge(auth, run_id, "claim", T0)
                leases = workers.lease_attempts(
                    auth, "dormant-worker", limit=len(run_ids), ttl_ms=LEASE_TTL_MS, now_ms=T0
                )
                for n, lease in enumerate(leases):
                    workers.mark_running(auth, lease, T0)
                    if n % 2:
                        workers.complete(
                            auth, lease, "succeeded", result_code=None, output=None, now_ms=T0
                        )
                        converge(auth, lease.run_id, "frontier", T0)


# --- copies -----------------------------------------------------------------------


def clone_sqlite(source: Path, target: Path) -> str:
    with (
        contextlib.closing(sqlite3.connect(source)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)
    return f"sqlite:///{target}"


class PgSchemas:
    """Fresh schemas on one PostgreSQL database, dropped at close."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.tag = uuid.uuid4().hex[:8]
        self.created: list[str] = []

    def _admin(self):
        import psycopg

        return psycopg.connect(self.base_url, autocommit=True)

    def clone(self, source: Path, label: str) -> str:
        """Copy every table of the SQLite file into a new schema; return its URL."""
        import psycopg

        from eventstore import open_store
        from projections import registry

        schema = f"bench_cycle_{self.tag}_{label}"
        with self._admin() as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        self.created.append(schema)
        url = with_search_path(self.base_url, schema)
        store = open_store(url)
        try:
            registry.migrate_all(store)
        finally:
            store.close()
        with contextlib.closing(sqlite3.connect(source)) as src, psycopg.connect(url) as pg:
            tables = [
                row[0]
                for row in src.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%' AND name != 'schema_versions' ORDER BY name"
                )
            ]
            with pg.cursor() as cur:
                for table in tables:
                    columns = ", ".join(
                        row[1] for row in src.execute(f"PRAGMA table_info({table})")
                    )
                    with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                        for row in src.execute(f"SELECT {columns} FROM {table}"):
                            copy.write_row(row)
                cur.execute(
                    "UPDATE qlflow_position SET last = "
                    "(SELECT COALESCE(MAX(global_position), 0) FROM events)"
                )
        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(f"VACUUM ANALYZE {', '.join(tables)}")
        return url

    def close(self) -> None:
        if not self.created:
            return
        with self._admin() as conn:
            for schema in self.created:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        self.created.clear()


# --- measuring ----------------------------------------------------------------------


def _loop_turns(units, run_ids: list[str], phase: str, now_ms: int):
    """The page read as the supervisor reads it, each Run's turn decided in turn on the
    calling thread (the supervisor commits them as it commits the actors' turns)."""
    streams = units.read(lambda tx: read_runs(tx, run_ids, units.aggregates))
    return [
        decide_turn(streams[r], phase, now_ms) if r in streams else prepare(units, r, phase, now_ms)
        for r in run_ids
    ]


def _direct_page(authority, run_ids: list[str], phase: str, now_ms: int):
    """The page's turns without actors, through the authority."""
    return _loop_turns(authority, run_ids, phase, now_ms)


def _inline_page(authority, run_ids: list[str], phase: str, now_ms: int):
    """The page's turns on the calling thread, no authority (profiling only)."""
    return _loop_turns(LocalUnits(authority.store), run_ids, phase, now_ms)


@contextlib.contextmanager
def _pages(decide_page: Callable | None) -> Iterator[None]:
    """Swap how the supervisor decides a page for the duration (None: the actors)."""
    if decide_page is None:
        yield
        return
    original = supervisor.decide_page
    supervisor.decide_page = decide_page
    try:
        yield
    finally:
        supervisor.decide_page = original


class HoldRecorder:
    """Per-Workflow transaction timings from the fault points around `run_unit`."""

    def __init__(self) -> None:
        self.side = ""
        self.holds: dict[str, list[tuple[float, float]]] = {}
        self._local = threading.local()

    def __enter__(self) -> HoldRecorder:
        for phase in RUN_PHASES:
            faults.arm(f"{phase}.after_begin", self._begun)
            faults.arm(f"{phase}.before_commit", self._worked)
            faults.arm(f"{phase}.after_commit", self._committed)
        return self

    def __exit__(self, *exc: object) -> None:
        faults.disarm()

    def _begun(self) -> None:
        self._local.begun = time.perf_counter()

    def _worked(self) -> None:
        self._local.worked = time.perf_counter()

    def _committed(self) -> None:
        begun = self._local.begun
        self.holds.setdefault(self.side, []).append(
            (self._local.worked - begun, time.perf_counter() - begun)
        )


@dataclass
class Side:
    """One store converging: its runtime, how its pages run, and what it cost."""

    label: str
    runtime: qlflow.Runtime
    decide_page: Callable | None = None  # how the supervisor decides a page (None: actors)
    seconds: float = 0.0
    worker_seconds: float = 0.0  # the worker's calls (a completion may end its Run)
    cycles: int = 0
    busy_cycles: int = 0
    settled_runs: int = 0
    settled_by_worker: int = 0  # Runs a completion of their last held Attempt ended
    settled_attempts: int = 0
    blocked: int = 0
    conflicts: int = 0
    written: int = 0  # Workflow turns the pages wrote
    errors: list[str] = field(default_factory=list)
    scanned: dict[str, int] = field(default_factory=dict)
    done: bool = False


def _finish(rt: qlflow.Runtime, held: Held, n: int, now_ms: int) -> None:
    if not held.started:
        rt.mark_running(held.lease, now_ms=now_ms)
    rt.complete(held.lease, "failed" if n % 3 == 0 else "succeeded", now_ms=now_ms)


def _running(rt: qlflow.Runtime) -> int:
    return rt.store.query("SELECT COUNT(*) FROM runs WHERE status = 'running'")[0][0]


def converge_sides(
    sides: Sequence[Side],
    held: Sequence[Held],
    recorder: HoldRecorder | None = None,
    max_cycles: int = 5_000,
) -> None:
    """Cycle every side until all its Runs are terminal, interleaved (the order
    alternates each round); between cycles the worker finishes a wave of held
    Attempts on every side. Only `cycle()` is timed."""
    now = CONVERGE_AT
    wave = max(1, math.ceil(len(held) / COMPLETION_WAVES))
    for round_no in range(max_cycles):
        for side in sides if round_no % 2 == 0 else reversed(sides):
            if side.done:
                continue
            if recorder is not None:
                recorder.side = side.label
            with _pages(side.decide_page):
                begun = time.perf_counter()
                result = side.runtime.cycle(now_ms=now)
                side.seconds += time.perf_counter() - begun
            side.cycles += 1
            side.busy_cycles += bool(result.changed)
            for phase in RUN_PHASES:
                part = getattr(result, phase)
                side.scanned[phase] = side.scanned.get(phase, 0) + part.scanned
                side.settled_runs += part.settled_runs
                side.settled_attempts += part.settled_attempts
                side.blocked += part.blocked
                side.conflicts += part.conflicts
                side.written += part.changed
                side.errors += part.errors
        for n in range(round_no * wave, min(len(held), (round_no + 1) * wave)):
            for side in sides:
                begun = time.perf_counter()
                _finish(side.runtime, held[n], n, now + 1)
                side.worker_seconds += time.perf_counter() - begun
                run = side.runtime.get_run(held[n].lease.run_id)
                side.settled_by_worker += run.status in ("cancelled", "timed_out")
        for side in sides:
            side.done = side.done or _running(side.runtime) == 0
        if all(side.done for side in sides):
            return
        now += CYCLE_STEP_MS
    raise RuntimeError(f"not converged after {max_cycles} cycles")


class _NoWork:
    """An authority whose reads find nothing: what is left is the actors."""

    store = None
    aggregates = None

    def read(self, fn: Callable) -> dict:
        return {}


def actor_machinery(page_size: int = 32, pages: int = 30) -> dict:
    """Spawn, ask and stop one page of Workflow actors with no work behind them."""
    run_ids = [f"run-{i}" for i in range(page_size)]
    timings = []
    for _ in range(pages):
        begun = time.perf_counter()
        supervisor.decide_page(_NoWork(), run_ids, "cancellation", T0)
        timings.append(time.perf_counter() - begun)
    page_ms = statistics.median(timings) * 1000
    return {"page_size": page_size, "page_ms": page_ms, "per_workflow_ms": page_ms / page_size}


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def _ms_stats(values: Sequence[float]) -> dict:
    return {
        "n": len(values),
        "p50": _percentile(values, 0.50) * 1000,
        "p95": _percentile(values, 0.95) * 1000,
        "p99": _percentile(values, 0.99) * 1000,
        "max": max(values) * 1000 if values else float("nan"),
    }


def fsync_floor(directory: Path, samples: int = 200) -> dict:
    """The disk's own latency for one 4 KiB write + fsync, in the bench's directory."""
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    timings = []
    try:
        for _ in range(samples):
            os.write(fd, b"x" * 4096)
            begun = time.perf_counter()
            os.fsync(fd)
            timings.append(time.perf_counter() - begun)
    finally:
        os.close(fd)
        path.unlink()
    return _ms_stats(timings)


def _side_summary(side: Side, workflows: int) -> dict:
    return {
        "workflows": workflows,
        "cycle_seconds": side.seconds,
        "settled_per_s": workflows / side.seconds,
        # the worker's mark_running and complete of every held Attempt; a completion
        # ends the Run it was the last hold of, work the cycle no longer does
        "worker_seconds": side.worker_seconds,
        "settled_per_s_with_worker": workflows / (side.seconds + side.worker_seconds),
        "cycles": side.cycles,
        "busy_cycles": side.busy_cycles,
        "settled_runs": side.settled_runs,
        "settled_by_worker": side.settled_by_worker,
        "settled_attempts": side.settled_attempts,
        "blocked": side.blocked,
        "conflicts": side.conflicts,
        "written": side.written,
        "errors": len(side.errors),
        "scanned": side.scanned,
    }


def bench_convergence(
    urls: tuple[str, str],
    held: list[Held],
    workflows: int,
    record: bool,
    reference_url: str | None = None,
):
    """Actors (first URL) vs the plain loop (second URL) over identical copies; with
    `reference_url`, a third copy converged by actors with synchronous=NORMAL (no
    fsync per COMMIT), to tell the disk's share from the code's."""
    with contextlib.ExitStack() as stack:
        actors_rt = stack.enter_context(qlflow.open(urls[0]))
        direct_rt = stack.enter_context(qlflow.open(urls[1]))
        actors = Side("actors", actors_rt)
        direct = Side("direct", direct_rt, decide_page=_direct_page)
        sides = [actors, direct]
        if reference_url is not None:
            normal_rt = stack.enter_context(qlflow.open(reference_url, synchronous="NORMAL"))
            sides.append(Side("normal", normal_rt))
        recorder = HoldRecorder()
        with recorder if record else contextlib.nullcontext():
            converge_sides(sides, held, recorder if record else None)
        profile = actors_rt.profile
    for side in sides:
        if side.errors:
            raise RuntimeError(f"{side.label}: {side.errors[:3]}")
        if side.settled_runs + side.settled_by_worker != workflows:
            raise RuntimeError(
                f"{side.label} settled {side.settled_runs} + {side.settled_by_worker} "
                f"(worker) of {workflows} Runs"
            )
        if (side.settled_attempts, side.scanned) != (actors.settled_attempts, actors.scanned):
            raise RuntimeError(f"the {side.label} and actors runs did not do the same work")
    result = {
        "profile": {"name": profile.name, "page_size": profile.page_size},
        "actors": _side_summary(actors, workflows),
        "direct": _side_summary(direct, workflows),
        "actor_overhead": actors.seconds / direct.seconds - 1,
    }
    if reference_url is not None:
        result["normal"] = _side_summary(sides[2], workflows)
    if record:
        holds = {}
        written = {side.label: side.written for side in sides}
        for label, timings in recorder.holds.items():
            holds[label] = {
                "hold_ms": _ms_stats([total for _, total in timings]),
                "work_ms": _ms_stats([work for work, _ in timings]),
                "commit_ms": _ms_stats([total - work for work, total in timings]),
                # a unit is a page: its Workflows share the hold
                "per_workflow_ms": sum(total for _, total in timings)
                * 1000
                / max(1, written.get(label, 0)),
                "units": len(timings),
            }
        result["lock_hold"] = holds
    return result


def _query_ms(store, phase: str, now_ms: int, repeat: int = 5) -> float:
    """Best time of one candidate page query (the first page of `phase`)."""
    timings = []
    for _ in range(repeat):
        begun = time.perf_counter()
        candidates.page(store, phase, now_ms, 32)
        timings.append(time.perf_counter() - begun)
    return min(timings) * 1000


def _record_intents(rt, run_ids: list[str], now_ms: int) -> None:
    """Cancel intent on fresh Runs, alone (a cancel would end them at once): what the
    cycle's cancellation phase then converges (untimed)."""
    writes = [RunWrite(r, lambda agg: request_cancel(agg, "user", now_ms)) for r in run_ids]
    with rt.store.transaction() as tx:
        write_runs(tx, writes, None, wait=True)


def bench_dormant(small_url: str, big_url: str, rounds: int) -> dict:
    """One cycle over CANDIDATES fresh Runs (started, with cancel intent: the
    cancellation phase's work), small vs big store, interleaved rounds."""
    timings: dict[str, list[float]] = {"small": [], "big": []}
    with qlflow.open(small_url) as small, qlflow.open(big_url) as big:
        stores = {"small": small, "big": big}
        for round_no in range(rounds):
            now = T0 + 10_000 + round_no * 1_000
            for rt in stores.values():
                fresh = [
                    rt.start(PACKAGE, "flow", admission_key=f"cand-{round_no}-{i}", now_ms=now)
                    for i in range(CANDIDATES)
                ]
                _record_intents(rt, [receipt.run_id for receipt in fresh], now)
            order = ("small", "big") if round_no % 2 == 0 else ("big", "small")
            for label in order:
                begun = time.perf_counter()
                result = stores[label].cycle(now_ms=now + 1)
                timings[label].append(time.perf_counter() - begun)
                if result.cancellation.scanned != CANDIDATES or result.cancellation.errors:
                    raise RuntimeError(f"{label}: the cycle did not take the candidates: {result}")
        runs = {
            label: rt.store.query("SELECT COUNT(*) FROM runs")[0][0] for label, rt in stores.items()
        }
        queries = {
            phase: {
                label: _query_ms(rt.store, phase, T0 + 10_000 + rounds * 1_000)
                for label, rt in stores.items()
            }
            for phase in RUN_PHASES
        }
    small_ms = statistics.median(timings["small"]) * 1000
    big_ms = statistics.median(timings["big"]) * 1000
    return {
        "candidates": CANDIDATES,
        "rounds": rounds,
        "runs_at_end": runs,
        "candidate_query_ms": queries,
        "cycle_ms": {label: [t * 1000 for t in values] for label, values in timings.items()},
        "small_median_ms": small_ms,
        "big_median_ms": big_ms,
        "ratio": big_ms / small_ms,
    }


# --- peak RSS of an edge process -----------------------------------------------------


def _peak_rss() -> dict:
    status = Path("/proc/self/status").read_text()
    vmhwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    return {
        "vmhwm_mib": vmhwm / 1024,
        "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def rss_child(db: str, held_file: str | None) -> None:
    """Child mode: converge the seeded store with the edge profile (or, without a
    held file, only open and close it); print peak RSS as JSON."""
    begun = time.perf_counter()
    with qlflow.open(f"sqlite:///{db}", "edge") as rt:
        summary: dict = {}
        if held_file is not None:
            held = [
                Held(workers.Lease(**item["lease"]), item["started"])
                for item in orjson.loads(Path(held_file).read_bytes())
            ]
            side = Side("edge", rt)
            converge_sides([side], held)
            summary = {"cycles": side.cycles, "settled_runs": side.settled_runs}
    summary.update(_peak_rss(), seconds=time.perf_counter() - begun)
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")


def bench_edge_rss(source: Path, held: list[Held], workdir: Path) -> dict:
    held_file = workdir / "held.json"
    held_file.write_bytes(orjson.dumps([asdict(h) for h in held]))
    result = {}
    for label, extra in (("open_only", []), ("converging", [str(held_file)])):
        db = workdir / f"rss-{label}.db"
        clone_sqlite(source, db)
        completed = subprocess.run(
            [sys.executable, "-m", "bench.cycle", "--rss-child", str(db), *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        result[label] = orjson.loads(completed.stdout.strip().splitlines()[-1])
    return result


# --- profiling ------------------------------------------------------------------------


def profile_convergence(url: str, held: list[Held], top: int = 25) -> str:
    """cProfile of one convergence with every unit on the main thread (no actors)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    with qlflow.open(url) as rt:
        side = Side("profile", rt, decide_page=_inline_page)
        profiler.enable()
        converge_sides([side], held)
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# --- report ------------------------------------------------------------------------------


def _met(value: float, target: float, higher_is_better: bool = False) -> bool:
    return value >= target if higher_is_better else value <= target


def rows(results: dict) -> list[tuple[str, str, str, str, bool | None]]:
    """(benchmark, store, figure, target, met) for the table."""
    table: list[tuple[str, str, str, str, bool | None]] = []
    for dialect, part in results["dialects"].items():
        conv = part["convergence"]
        per_s = conv["actors"]["settled_per_s"]
        target = TARGETS["settled_per_s"]
        table.append(
            (
                f"1 cancellation convergence ({conv['actors']['workflows']:,} x 8)",
                f"{dialect} {conv['profile']['name']}",
                f"{per_s:,.0f} Workflows/s ({conv['actors']['cycles']} cycles, "
                f"{conv['actors']['cycle_seconds']:.2f} s); the worker's calls between "
                f"cycles {conv['actors']['worker_seconds']:.2f} s, "
                f"{conv['actors']['settled_by_worker']:,} Runs ended by a completion",
                f">= {target:,}/s",
                _met(per_s, target, True),
            )
        )
        dormant = part["dormant"]
        table.append(
            (
                f"2 cycle over {dormant['candidates']} candidates, dormant "
                f"{SMALL_DORMANT:,} vs {results['sizes']['dormant']:,}",
                dialect,
                f"{dormant['small_median_ms']:.1f} ms vs {dormant['big_median_ms']:.1f} ms: "
                f"ratio {dormant['ratio']:.2f}",
                f"<= {TARGETS['dormant_ratio']}",
                _met(dormant["ratio"], TARGETS["dormant_ratio"]),
            )
        )
        if "normal" in conv:
            normal = conv["normal"]
            hold = conv["lock_hold"]["normal"]["hold_ms"]
            table.append(
                (
                    "1/3 reference: the same with synchronous=NORMAL (no fsync per COMMIT)",
                    f"{dialect} {conv['profile']['name']}",
                    f"{normal['settled_per_s']:,.0f} Workflows/s; lock hold p50 "
                    f"{hold['p50']:.2f} / p95 {hold['p95']:.2f} ms",
                    "(not a target)",
                    None,
                )
            )
        if dialect == "sqlite":
            hold = conv["lock_hold"]["actors"]
            floor = part["fsync_ms"]
            table.append(
                (
                    "3 write-lock hold per Workflow (synchronous=FULL)",
                    dialect,
                    f"{hold['per_workflow_ms']:.2f} ms per Workflow written (a page's unit "
                    f"holds it p50 {hold['hold_ms']['p50']:.2f} / p95 "
                    f"{hold['hold_ms']['p95']:.2f} ms for its Workflows together; work p95 "
                    f"{hold['work_ms']['p95']:.2f}, COMMIT p95 {hold['commit_ms']['p95']:.2f}; "
                    f"raw fsync p50 {floor['p50']:.2f} / p95 {floor['p95']:.2f})",
                    f"<= {TARGETS['lock_hold_p95_ms']} ms",
                    _met(hold["per_workflow_ms"], TARGETS["lock_hold_p95_ms"]),
                )
            )
        overhead = conv["actor_overhead"]
        machinery = results["actor_machinery"]["per_workflow_ms"]
        table.append(
            (
                "4 actor overhead (same pages, actors vs plain loop)",
                dialect,
                f"{overhead:+.1%} ({conv['actors']['cycle_seconds']:.2f} s vs "
                f"{conv['direct']['cycle_seconds']:.2f} s; actor spawn+ask+stop alone "
                f"{machinery:.2f} ms/Workflow)",
                f"<= {TARGETS['actor_overhead']:.0%}",
                _met(overhead, TARGETS["actor_overhead"]),
            )
        )
    if "edge_rss" in results:
        rss = results["edge_rss"]
        peak = rss["converging"]["vmhwm_mib"]
        table.append(
            (
                f"5 peak RSS, edge process converging {results['sizes']['rss_workflows']:,}",
                "sqlite edge",
                f"{peak:.1f} MiB (open only: {rss['open_only']['vmhwm_mib']:.1f} MiB)",
                f"<= {TARGETS['edge_rss_mib']} MiB",
                _met(peak, TARGETS["edge_rss_mib"]),
            )
        )
    return table


def render(results: dict, console) -> None:
    from rich.table import Table

    size = "smoke" if results.get("smoke") else "quick" if results["quick"] else "full"
    table = Table(title=f"qlflow cycle ({size} sizes)")
    for column in ("benchmark", "store", "figure", "target", "met"):
        table.add_column(column)
    for name, store, figure, target, met in rows(results):
        mark = "-" if met is None else ("[green]yes[/]" if met else "[red]no[/]")
        table.add_row(name, store, figure, target, mark)
    console.print(table)
    seeding = ", ".join(f"{k} {v:.1f} s" for k, v in results["seeding_seconds"].items())
    console.print(f"seeding (not timed above): {seeding}")
    console.print(f"load average before/after: {results['loadavg']}")


# --- main ------------------------------------------------------------------------------


def _timed(seconds: dict, label: str, fn: Callable):
    begun = time.perf_counter()
    value = fn()
    seconds[label] = time.perf_counter() - begun
    return value


def run(sizes: Sizes, pg_url: str | None, workdir: Path, profile: bool) -> dict:
    seeding: dict[str, float] = {}
    results: dict = {
        "sizes": asdict(sizes),
        "dialects": {},
        "seeding_seconds": seeding,
        "loadavg": [os.getloadavg()],
    }
    cancel_seed = workdir / "cancel-seed.db"
    held = _timed(seeding, "cancellation", lambda: seed_cancellation(cancel_seed, sizes.workflows))
    small_seed, big_seed = workdir / "dormant-small.db", workdir / "dormant-big.db"
    _timed(seeding, "dormant_small", lambda: seed_dormant(small_seed, SMALL_DORMANT))
    _timed(seeding, "dormant_big", lambda: seed_dormant(big_seed, sizes.dormant))
    results["held_attempts"] = len(held)

    sqlite_part = {"fsync_ms": fsync_floor(workdir)}
    results["actor_machinery"] = actor_machinery()
    urls = (
        clone_sqlite(cancel_seed, workdir / "cancel-actors.db"),
        clone_sqlite(cancel_seed, workdir / "cancel-direct.db"),
    )
    sqlite_part["convergence"] = bench_convergence(
        urls,
        held,
        sizes.workflows,
        record=True,
        reference_url=clone_sqlite(cancel_seed, workdir / "cancel-normal.db"),
    )
    sqlite_part["dormant"] = bench_dormant(
        clone_sqlite(small_seed, workdir / "dormant-small-run.db"),
        clone_sqlite(big_seed, workdir / "dormant-big-run.db"),
        sizes.dormant_rounds,
    )
    results["dialects"]["sqlite"] = sqlite_part

    if pg_url:
        schemas = PgSchemas(pg_url)
        try:
            pg_urls = _timed(
                seeding,
                "pg_copy_cancellation",
                lambda: (schemas.clone(cancel_seed, "act"), schemas.clone(cancel_seed, "dir")),
            )
            pg_part = {"convergence": bench_convergence(pg_urls, held, sizes.workflows, True)}
            small_url, big_url = _timed(
                seeding,
                "pg_copy_dormant",
                lambda: (schemas.clone(small_seed, "small"), schemas.clone(big_seed, "big")),
            )
            pg_part["dormant"] = bench_dormant(small_url, big_url, sizes.dormant_rounds)
            results["dialects"]["postgresql"] = pg_part
        finally:
            schemas.close()

    rss_seed = workdir / "rss-seed.db"
    rss_held = seed_cancellation(rss_seed, sizes.rss_workflows)
    results["edge_rss"] = bench_edge_rss(rss_seed, rss_held, workdir)

    if profile:
        results["profile_sqlite"] = profile_convergence(
            clone_sqlite(cancel_seed, workdir / "cancel-profile.db"), held
        )
    results["loadavg"].append(os.getloadavg())
    return results


def main(argv: Sequence[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(prog="python -m bench.cycle", description=__doc__)
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"), help="PostgreSQL URL")
    parser.add_argument("--quick", action="store_true", help="small sizes (under a minute)")
    parser.add_argument("--smoke", action="store_true", help="smallest sizes: does it still run")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of 1. (SQLite)")
    parser.add_argument("--rss-child", nargs="+", metavar="DB", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child[0], args.rss_child[1] if len(args.rss_child) > 1 else None)
        return None

    from rich.console import Console

    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="qlflow-bench-cycle-", dir="/var/tmp") as tmp:
        results = run(sizes, args.pg, Path(tmp), args.profile)
    results["quick"] = args.quick
    results["smoke"] = args.smoke
    profile_text = results.pop("profile_sqlite", None)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    console = Console(width=None if sys.stdout.isatty() else 160)
    if profile_text:
        console.print(profile_text, markup=False, highlight=False)
    render(results, console)
    console.print(f"written {RESULTS}")
    return results


if __name__ == "__main__":
    main()
