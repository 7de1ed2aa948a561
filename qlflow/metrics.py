"""Prometheus metrics of a qlflow host (docs/DESIGN.md, "Observability").

    import qlflow.metrics                  # a submodule: imported when asked for
    rt = qlflow.open(url)
    qlflow.metrics.instrument(rt)          # count what this runtime commits
    app.mount("/metrics", prometheus_client.make_asgi_app(qlflow.metrics.registry()))

Counters are derived from the records each commit appended, in one observer the
store calls once COMMIT has answered (`eventstore.observers`): a lease granted, a
step finished, a retry, a lease that expired, a schedule fire or skip — counted by
event type where it is acknowledged, not incremented wherever it is decided, so a
replay or a rolled-back write counts nothing. Gauges that need the store (the queue
per Task, the oldest claim, the Attempts running, the Runs by status) are read at
scrape time from indexes of the read models (`projections.gauges`), at most once per
`min_interval_s`; a scrape on a store of 100,000 Runs reads no Run's row.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from domain import event_types, streams
from domain.event_types import EventType, Family
from domain.phases import PHASES
from domain.records import Record
from domain.transitions import (
    ATTEMPT_INTERRUPTED,
    ATTEMPT_TERMINAL,
    LEASE_EXPIRED,
    RETRY_CHANGE,
    RUN_TERMINAL,
    STEP_TERMINAL,
    WORKER_SHUTDOWN,
)
from eventstore.observers import Commit
from projections import gauges
from qlflow.clock import wall_clock_ms
from qlflow.runtime import Runtime

__all__ = ["Instrumented", "instrument", "registry", "track_slots"]

_REGISTRY = CollectorRegistry()
UNKNOWN_TASK = ""  # a step whose StepRun the read models no longer hold
_TASKS_HELD = 65_536  # (run id, step key) -> task ref remembered from plans and claims

COMMIT_SECONDS = Histogram(
    "qlflow_store_commit_duration_seconds",
    "Time of one committed write transaction, from BEGIN to COMMIT's answer.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=_REGISTRY,
)
COMMIT_ROUND_TRIPS = Histogram(
    "qlflow_store_commit_round_trips",
    "Round trips to the database of one committed write transaction, BEGIN and COMMIT "
    "included (PostgreSQL: network round trips; SQLite: statements).",
    buckets=(1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64),
    registry=_REGISTRY,
)
STORE_ERRORS = Counter(
    "qlflow_store_errors",
    "Store calls that failed because the database could not serve them, by kind.",
    ["kind"],
    registry=_REGISTRY,
)
CYCLE_PHASE_SECONDS = Histogram(
    "qlflow_cycle_phase_duration_seconds",
    "Time of one cycle phase, by phase.",
    ["phase"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
    registry=_REGISTRY,
)
HOST_SLOTS = Gauge("qlflow_host_slots", "Attempts this host may run at once.", registry=_REGISTRY)
HOST_SLOTS_IN_USE = Gauge(
    "qlflow_host_slots_in_use", "Attempts this host runs now.", registry=_REGISTRY
)


def registry() -> CollectorRegistry:
    """The registry every qlflow metric is in, for a host to serve or mount."""
    return _REGISTRY


class _Counts(Collector):
    """The counters derived from committed records, counted under one lock per commit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, tuple[str, ...]], float] = {}
        # the Task of a step, from the plans and claims this process saw commit; a step
        # finished whose Task is not known yet is counted at the next scrape
        self._tasks: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._unresolved: list[tuple[tuple[str, str], str, tuple[str, ...]]] = []
        self.resolve: Callable[[list[tuple[str, str]]], dict[tuple[str, str], str]] | None = None
        self._handlers: dict[str, Callable[[Record], None]] = {
            EventType.WORKFLOW_ADMITTED: self._admitted,
            EventType.ATTEMPT_CLAIMED: self._claimed,
            EventType.LEASE_GRANTED: self._granted,
            EventType.LEASE_RELEASED: self._released,
            EventType.SCHEDULE_FIRED: self._fired,
            EventType.SCHEDULE_SKIPPED: self._skipped,
            **{event_types.of(Family.STEP, s): self._step_ended for s in STEP_TERMINAL},
            event_types.of(Family.STEP, RETRY_CHANGE[1]): self._step_ready,
            **{event_types.of(Family.ATTEMPT, s): self._attempt_ended for s in ATTEMPT_TERMINAL},
            **{event_types.of(Family.WORKFLOW, s): self._run_ended for s in RUN_TERMINAL},
        }

    def observe(self, commit: Commit) -> None:
        handlers = self._handlers
        with self._lock:
            for record in commit.records:
                handler = handlers.get(record.type)
                if handler is not None:
                    handler(record)

    def _add(self, name: str, *labels: str) -> None:
        key = (name, labels)
        self._counts[key] = self._counts.get(key, 0) + 1

    def _remember(self, run_id: str, step_key: str, task_ref: str) -> None:
        tasks = self._tasks
        tasks[(run_id, step_key)] = task_ref
        if len(tasks) > _TASKS_HELD:
            tasks.popitem(last=False)

    def _by_task(self, record: Record, name: str, *labels: str) -> None:
        step = (streams.entity_id(record.stream_id), record.data["step_key"])
        task = self._tasks.get(step)
        if task is None:
            self._unresolved.append((step, name, labels))
        else:
            self._add(name, task, *labels)

    def _admitted(self, record: Record) -> None:
        self._add("runs_admitted")
        run_id = streams.entity_id(record.stream_id)
        for step in record.data["plan"]["steps"]:
            self._remember(run_id, step["key"], step["task_ref"])

    def _claimed(self, record: Record) -> None:
        data = record.data
        task = data["admission"]["task_ref"]
        self._remember(streams.entity_id(record.stream_id), data["step_key"], task)

    def _granted(self, record: Record) -> None:
        self._add("leases_granted")
        data = record.data
        self._remember(data["run_id"], data["step_key"], data["task_ref"])

    def _released(self, record: Record) -> None:
        if record.data.get("reason") == LEASE_EXPIRED:
            self._add("lease_expiries")

    def _fired(self, record: Record) -> None:
        self._add("schedule_fires")

    def _skipped(self, record: Record) -> None:
        self._add("schedule_skips", str(record.data.get("reason")))

    def _step_ended(self, record: Record) -> None:
        self._by_task(record, "steps_finished", event_types.name(record.type))

    def _step_ready(self, record: Record) -> None:
        if (record.data.get("from"), record.data.get("to")) == RETRY_CHANGE and record.data.get(
            "retry_at_ms"
        ) is not None:
            self._by_task(record, "step_retries")

    def _attempt_ended(self, record: Record) -> None:
        if (
            event_types.name(record.type) == ATTEMPT_INTERRUPTED
            or record.data.get("result_code") == WORKER_SHUTDOWN
        ):
            self._add("interruptions")

    def _run_ended(self, record: Record) -> None:
        self._add("runs_finished", event_types.name(record.type))

    def _settle_unresolved(self) -> None:
        """Count the steps whose Task was not known when they finished."""
        with self._lock:
            waiting, self._unresolved = self._unresolved, []
        if not waiting:
            return
        missing = sorted({step for step, _, _ in waiting if step not in self._tasks})
        found = self.resolve(missing) if self.resolve is not None and missing else {}
        with self._lock:
            for step, name, labels in waiting:
                task = self._tasks.get(step) or found.get(step, UNKNOWN_TASK)
                self._add(name, task, *labels)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families are built at collect time

    def collect(self) -> Iterator[Metric]:
        # a scrape while the store is down still answers the rest
        with contextlib.suppress(Exception):
            self._settle_unresolved()
        with self._lock:
            counts = dict(self._counts)
        for name, (help_text, label_names) in _COUNTERS.items():
            family = CounterMetricFamily(f"qlflow_{name}", help_text, labels=label_names)
            for (counted, labels), value in sorted(counts.items()):
                if counted == name:
                    family.add_metric(list(labels), value)
            yield family


_COUNTERS: dict[str, tuple[str, list[str]]] = {
    "runs_admitted": ("Runs admitted (committed by this process).", []),
    "runs_finished": ("Runs that reached a terminal status, by status.", ["status"]),
    "leases_granted": ("Leases granted to workers.", []),
    "steps_finished": ("Steps that reached a terminal status, by Task and outcome.",
                       ["task", "outcome"]),
    "step_retries": ("Failed Attempts whose step waits for a retry, by Task.", ["task"]),
    "lease_expiries": ("Leases released because they expired (recovery, cancellation).", []),
    "interruptions": ("Attempts their host stopped (interrupted: the step runs again).", []),
    "schedule_fires": ("Schedule occurrences that admitted their Run.", []),
    "schedule_skips": ("Schedule occurrences skipped, by reason.", ["reason"]),
}  # fmt: skip


class _StoreGauges(Collector):
    """The gauges read from the store of the instrumented runtime, at most once per
    `min_interval_s` however often it is scraped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runtime: Runtime | None = None
        self.min_interval_s = 1.0
        self.clock: Callable[[], int] = wall_clock_ms
        self._read_at = 0.0
        self._cached: gauges.Gauges | None = None
        self._cached_at_ms = 0

    def forget(self) -> None:
        with self._lock:
            self._cached = None

    def _reading(self) -> tuple[gauges.Gauges, int] | None:
        with self._lock:
            runtime = self.runtime
            if runtime is None:
                return None
            now = time.monotonic()
            if self._cached is None or now - self._read_at >= self.min_interval_s:
                now_ms = self.clock()
                self._cached = gauges.read_gauges(runtime.store, now_ms)
                self._cached_at_ms = now_ms
                self._read_at = now
            return self._cached, self._cached_at_ms

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        try:
            reading = self._reading()
        except Exception:  # the store is down: the counters still answer
            STORE_ERRORS.labels("scrape").inc()
            return
        if reading is None:
            return
        found, at_ms = reading
        queued = GaugeMetricFamily(
            "qlflow_attempts_queued",
            "Attempts claimed and not leased (waiting for a worker), by Task.",
            labels=["task"],
        )
        oldest = GaugeMetricFamily(
            "qlflow_attempts_oldest_claim_age_seconds",
            "Age of the oldest Attempt claimed and not leased, by Task.",
            labels=["task"],
        )
        for queue in found.queues:
            queued.add_metric([queue.task_ref], queue.queued)
            oldest.add_metric([queue.task_ref], max(0, at_ms - queue.oldest_claim_ms) / 1000)
        running = GaugeMetricFamily(
            "qlflow_attempts_running", "Attempts starting or running, by Task.", labels=["task"]
        )
        for task, count in found.running.items():
            running.add_metric([task], count)
        runs = GaugeMetricFamily("qlflow_runs", "Runs by status.", labels=["status"])
        for status, count in found.runs.items():
            runs.add_metric([status], count)
        yield from (queued, oldest, running, runs)


_COUNTS = _Counts()
_GAUGES = _StoreGauges()
_REGISTRY.register(_COUNTS)
_REGISTRY.register(_GAUGES)


@dataclass
class Instrumented:
    """A runtime's connection to the metrics; `close()` (or the runtime's own close)
    ends it."""

    runtime: Runtime
    _removers: tuple[Callable[[], None], ...]

    def close(self) -> None:
        for remove in self._removers:
            remove()
        self._removers = ()
        if self.runtime._cycle.on_phase is _phase_timed:
            self.runtime._cycle.on_phase = None
        if _GAUGES.runtime is self.runtime:
            _GAUGES.runtime = None
            _COUNTS.resolve = None


def _commit(commit: Commit) -> None:
    COMMIT_SECONDS.observe(commit.seconds)
    COMMIT_ROUND_TRIPS.observe(commit.round_trips)
    _COUNTS.observe(commit)


def _store_error(reason: str) -> None:
    STORE_ERRORS.labels(reason).inc()


def _phase_timed(phase: str, seconds: float) -> None:
    CYCLE_PHASE_SECONDS.labels(phase).observe(seconds)


def instrument(
    rt: Runtime, *, min_interval_s: float = 1.0, clock: Callable[[], int] = wall_clock_ms
) -> Instrumented:
    """Count what `rt` commits and time its cycles; the store gauges read `rt`'s store
    (the runtime instrumented last) at `clock()` (epoch ms), at most once per
    `min_interval_s`."""
    observers = rt.store.observers
    removers = (observers.on_commit(_commit), observers.on_error(_store_error))
    rt._cycle.on_phase = _phase_timed
    with _GAUGES._lock:
        _GAUGES.runtime = rt
        _GAUGES.min_interval_s = min_interval_s
        _GAUGES.clock = clock
        _GAUGES._cached = None
    _COUNTS.resolve = lambda steps: gauges.step_tasks(rt.store, steps)
    for phase in PHASES:  # every phase is listed from the first scrape
        CYCLE_PHASE_SECONDS.labels(phase)
    return Instrumented(rt, removers)


def track_slots(total: int, in_use: Callable[[], int]) -> None:
    """Report a host's slots: `total`, and `in_use()` read at each scrape."""
    HOST_SLOTS.set(total)
    HOST_SLOTS_IN_USE.set_function(in_use)
