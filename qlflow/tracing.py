"""OpenTelemetry traces of Runs, from the log (docs/DESIGN.md, "Observability").

    pip install 'qlflow[otel]'
    tracing = qlflow.tracing.trace_runs(rt)   # the host's TracerProvider (global API)

When a commit ends a Run, its spans are built from the Run's stream with the times
the log recorded — a span per Run (admission to terminal), a child per Step (first
record to its end) and, under it, one per Attempt (claim to end) — with the ids,
plan digest, outcome and result code as attributes. Built from the log, a trace does
not depend on which host ran what, or on one host living through the whole Run. The
spans are made on a thread of their own, so a commit waits for none of it. qlflow
never installs a TracerProvider: without one configured by the host, the API's
no-op provider drops every span. Importing this module imports opentelemetry; the
rest of qlflow never does.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TracerProvider,
)

from domain import event_types, streams, transitions
from domain.event_types import EventType, Family
from domain.records import Record
from domain.transitions import ATTEMPT_TERMINAL, RUN_TERMINAL, STEP_TERMINAL
from eventstore.api import EventStore
from eventstore.observers import Commit
from qlflow import trace_context
from qlflow.runtime import Runtime
from qlflow.trace_context import traceparent

__all__ = ["RunTracing", "trace_runs"]

_ENDED = frozenset(event_types.of(Family.WORKFLOW, status) for status in RUN_TERMINAL)
_SUCCEEDED = transitions.Status.SUCCEEDED
_RUN_PREFIX = streams.prefix(streams.RUN)
# Runs whose records this process committed, kept until they end (beyond it a
# Run's stream is read back instead)
MAX_HELD_RUNS = 10_000


def _ns(record: Record) -> int:
    return int(record.metadata["at_ms"]) * 1_000_000


def _status(outcome: str, result_code: str | None) -> Status:
    if outcome == _SUCCEEDED:
        return Status(StatusCode.OK)
    return Status(StatusCode.ERROR, result_code or outcome)


class RunTracing:
    """Builds the spans of each Run a commit of `store` ends, on its own thread."""

    def __init__(self, store: EventStore, tracer: Tracer) -> None:
        self._store = store
        self._tracer = tracer
        self._ended: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._held: dict[str, list[Record]] = {}  # run stream -> its records seen committed
        self._remove = store.observers.on_commit(self._observe)
        self._thread = threading.Thread(target=self._work, name="qlflow-tracing", daemon=True)
        self._thread.start()

    def _observe(self, commit: Commit) -> None:
        """Keep the Run records of the commit (so a Run made in this process is not
        read back at its end) and queue each Run it ends."""
        ended = []
        with self._lock:
            held = self._held
            for record in commit.records:
                stream = record.stream_id
                if not stream.startswith(_RUN_PREFIX):
                    continue
                if record.type in _ENDED:
                    ended.append(streams.entity_id(stream))
                records = held.get(stream)
                if records is None:
                    if record.stream_version != 1:
                        continue  # begun before this process saw it: read back at its end
                    if len(held) >= MAX_HELD_RUNS:  # the oldest is read back instead
                        del held[next(iter(held))]
                    records = held[stream] = []
                records.append(record)
        for run_id in ended:
            self._ended.put(run_id)

    def _work(self) -> None:
        while True:
            run_id = self._ended.get()
            try:
                if run_id is None:
                    return
                self.export(run_id)
            except Exception:  # a trace never stops the next one
                pass
            finally:
                self._ended.task_done()

    def flush(self) -> None:
        """Wait until every Run ended so far has its spans made."""
        self._ended.join()

    def close(self) -> None:
        """Stop observing, make what waits, and end the thread."""
        self._remove()
        self._ended.put(None)
        self._thread.join()

    def _records(self, run_id: str) -> list[Record]:
        """The Run's stream: as this process saw it committed when that is all of it
        (commits observed out of order, or a Run begun elsewhere: read back)."""
        stream = streams.run_stream(run_id)
        with self._lock:
            held = self._held.pop(stream, None)
        if held is not None:
            held.sort(key=lambda record: record.stream_version)
            if all(record.stream_version == n for n, record in enumerate(held, start=1)):
                return held
        return self._store.read_stream(stream)

    def export(self, run_id: str) -> None:
        """Make the spans of one ended Run from its stream."""
        records = self._records(run_id)
        if not records or records[-1].type not in _ENDED:
            return
        admitted, ended = records[0], records[-1]
        plan: Mapping[str, Any] = admitted.data["plan"]
        outcome = event_types.name(ended.type)
        result_code = ended.data.get("result_code")
        run_span = self._tracer.start_span(
            f"qlflow.run {plan['package']}/{plan['workflow_key']}",
            context=_run_parent(run_id),
            start_time=_ns(admitted),
            attributes={
                "qlflow.run_id": run_id,
                "qlflow.package": plan["package"],
                "qlflow.workflow": plan["workflow_key"],
                "qlflow.plan_digest": plan["plan_digest"],
                "qlflow.outcome": outcome,
                "qlflow.result_code": result_code or "",
            },
        )
        run_span.set_status(_status(outcome, result_code))
        self._children(run_span, plan, records)
        run_span.end(end_time=_ns(ended))

    def _children(self, run_span: Span, plan: Mapping[str, Any], records: list[Record]) -> None:
        """A span per Step and, inside it, per Attempt, in the order the log has them."""
        tasks = {step["key"]: step["task_ref"] for step in plan["steps"]}
        parent = trace.set_span_in_context(run_span)
        steps: dict[str, Span] = {}
        attempts: dict[str, Span] = {}
        attempt_steps: dict[str, str] = {}
        for record in records:
            family, name = event_types.family(record.type), event_types.name(record.type)
            data = record.data
            if record.type == EventType.STEP_CREATED:
                steps[data["step_key"]] = self._tracer.start_span(
                    f"qlflow.step {data['step_key']}",
                    context=parent,
                    start_time=_ns(record),
                    attributes={
                        "qlflow.run_id": streams.entity_id(record.stream_id),
                        "qlflow.step_key": data["step_key"],
                        "qlflow.step_run_id": data["step_run_id"],
                        "qlflow.task_ref": tasks.get(data["step_key"], ""),
                    },
                )
            elif record.type == EventType.ATTEMPT_CLAIMED:
                step_span = steps[data["step_key"]]
                attempt_steps[data["attempt_id"]] = data["step_key"]
                attempts[data["attempt_id"]] = self._tracer.start_span(
                    f"qlflow.attempt {data['step_key']} #{data['attempt_number']}",
                    context=trace.set_span_in_context(step_span),
                    start_time=_ns(record),
                    attributes={
                        "qlflow.attempt_id": data["attempt_id"],
                        "qlflow.attempt_number": data["attempt_number"],
                        "qlflow.task_ref": data["admission"]["task_ref"],
                        # the parent the Attempt's process was told (TRACEPARENT)
                        "qlflow.traceparent": traceparent(
                            streams.entity_id(record.stream_id), data["attempt_id"]
                        ),
                    },
                )
            elif (
                family == Family.ATTEMPT
                and name in ATTEMPT_TERMINAL
                and (data["attempt_id"] in attempts)
            ):
                span = attempts.pop(data["attempt_id"])
                _end(span, name, data.get("result_code"), record)
            elif family == Family.STEP and name in STEP_TERMINAL and data["step_key"] in steps:
                _end(steps.pop(data["step_key"]), name, data.get("result_code"), record)
        for span in (*attempts.values(), *steps.values()):  # a log cut short: end them now
            span.end()


def _run_parent(run_id: str) -> Context:
    """The Run span's parent: a remote span whose trace id derives from the run id
    (`qlflow.trace_context`), so the Run's spans are in the trace its commands and
    Python Tasks were told about, whichever host makes them."""
    parent = SpanContext(
        trace_id=trace_context.trace_id(run_id),
        span_id=trace_context.root_span_id(run_id),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _end(span: Span, outcome: str, result_code: str | None, record: Record) -> None:
    span.set_attribute("qlflow.outcome", outcome)
    span.set_attribute("qlflow.result_code", result_code or "")
    span.set_status(_status(outcome, result_code))
    span.end(end_time=_ns(record))


def trace_runs(rt: Runtime, tracer_provider: TracerProvider | None = None) -> RunTracing:
    """Trace every Run a commit of `rt` ends, with `tracer_provider` (default: the
    global one the host configured; qlflow never sets it)."""
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    return RunTracing(rt.store, provider.get_tracer("qlflow"))
