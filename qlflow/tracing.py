"""OpenTelemetry traces of Runs, from the log (docs/DESIGN.md, "Observability").

    pip install 'qlflow[otel]'
    import qlflow.tracing
    tracing = qlflow.tracing.trace_runs(rt)   # the host's TracerProvider (global API)

When a commit ends a Run, its spans are built from the Run's stream with the times
the log recorded — a span per Run (admission to terminal), a child per Step (created
to its end) and, under it, one per Attempt (claim to end) — with the ids, plan
digest, outcome and result code as attributes. One pass over the stream finds where
each Step and Attempt begins and ends; each span is then made with all its
attributes at once and ended at once, the SDK's cheapest path (DESIGN.md has the
cost). Built from the log, a trace does
not depend on which host ran what, or on one host living through the whole Run. The
spans are made on a thread of their own, so a commit waits for none of it. qlflow
never installs a TracerProvider: without one configured by the host, the API's
no-op provider drops every span. Importing this module imports opentelemetry; the
rest of qlflow never does.
"""

from __future__ import annotations

import operator
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
# what a span needs of a record: whether it begins or ends a Step or an Attempt
_STEP_BEGINS, _STEP_ENDS, _ATTEMPT_BEGINS, _ATTEMPT_ENDS = "sb", "se", "ab", "ae"
_STEP_END_TYPES = {event_types.of(Family.STEP, s): _STEP_ENDS for s in STEP_TERMINAL}
_ATTEMPT_END_TYPES = {event_types.of(Family.ATTEMPT, s): _ATTEMPT_ENDS for s in ATTEMPT_TERMINAL}
_KINDS: dict[str, str] = {
    EventType.STEP_CREATED: _STEP_BEGINS,
    EventType.ATTEMPT_CLAIMED: _ATTEMPT_BEGINS,
    **_STEP_END_TYPES,
    **_ATTEMPT_END_TYPES,
}
_OUTCOMES = {t: event_types.name(t) for t in (*_ENDED, *_STEP_END_TYPES, *_ATTEMPT_END_TYPES)}
_UNFINISHED = "unfinished"  # a Step or Attempt the log does not end before the Run's end
_NOT_ERRORS = frozenset({transitions.Status.SUCCEEDED.value, _UNFINISHED})
_RUN_PREFIX = streams.prefix(streams.RUN)
_VERSION = operator.attrgetter("stream_version")
# Runs whose records this process committed, kept until they end (beyond it a
# Run's stream is read back instead)
MAX_HELD_RUNS = 10_000


def _ns(record: Record) -> int:
    return int(record.metadata["at_ms"]) * 1_000_000


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
            held.sort(key=_VERSION)  # one pass when observed in order
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
        outcome = _OUTCOMES[ended.type]
        result_code = ended.data.get("result_code")
        end_ns = _ns(ended)
        tracer = self._tracer
        run_span = tracer.start_span(
            f"qlflow.run {plan['package']}/{plan['workflow_key']}",
            context=_run_parent(run_id),
            start_time=_ns(admitted),
            attributes=_with_code(
                {
                    "qlflow.run_id": run_id,
                    "qlflow.package": plan["package"],
                    "qlflow.workflow": plan["workflow_key"],
                    "qlflow.plan_digest": plan["plan_digest"],
                    "qlflow.outcome": outcome,
                },
                result_code,
            ),
        )
        parent = trace.set_span_in_context(run_span)
        tasks = {step["key"]: step["task_ref"] for step in plan["steps"]}
        for step in _steps(records):
            step_span = tracer.start_span(
                f"qlflow.step {step.key}",
                context=parent,
                start_time=step.start_ns,
                attributes=_with_code(
                    {
                        "qlflow.step_key": step.key,
                        "qlflow.step_run_id": step.step_run_id,
                        "qlflow.task_ref": tasks.get(step.key, ""),
                        "qlflow.outcome": step.outcome,
                    },
                    step.result_code,
                ),
            )
            in_step = trace.set_span_in_context(step_span) if step.attempts else parent
            for attempt in step.attempts:
                attempt_span = tracer.start_span(
                    f"qlflow.attempt {step.key} #{attempt.number}",
                    context=in_step,
                    start_time=attempt.start_ns,
                    attributes=_with_code(
                        {
                            "qlflow.attempt_id": attempt.attempt_id,
                            "qlflow.attempt_number": attempt.number,
                            "qlflow.outcome": attempt.outcome,
                            # the parent the Attempt's process was told (TRACEPARENT)
                            "qlflow.traceparent": traceparent(run_id, attempt.attempt_id),
                        },
                        attempt.result_code,
                    ),
                )
                _end(attempt_span, attempt.outcome, attempt.result_code, attempt.end_ns or end_ns)
            _end(step_span, step.outcome, step.result_code, step.end_ns or end_ns)
        _end(run_span, outcome, result_code, end_ns)


class _Attempt:
    """One Attempt as its records tell it (an open one has no end yet)."""

    __slots__ = ("attempt_id", "end_ns", "number", "outcome", "result_code", "start_ns")

    def __init__(self, data: Mapping[str, Any], start_ns: int) -> None:
        self.attempt_id: str = data["attempt_id"]
        self.number: int = data["attempt_number"]
        self.start_ns = start_ns
        self.end_ns: int | None = None
        self.outcome = _UNFINISHED
        self.result_code: str | None = None


class _Step:
    """One Step as its records tell it, with its Attempts in claim order."""

    __slots__ = ("attempts", "end_ns", "key", "outcome", "result_code", "start_ns",
                 "step_run_id")  # fmt: skip

    def __init__(self, data: Mapping[str, Any], start_ns: int) -> None:
        self.key: str = data["step_key"]
        self.step_run_id: str = data["step_run_id"]
        self.start_ns = start_ns
        self.end_ns: int | None = None
        self.outcome = _UNFINISHED
        self.result_code: str | None = None
        self.attempts: list[_Attempt] = []


def _steps(records: list[Record]) -> list[_Step]:
    """The Steps of a Run's stream with their Attempts, in one pass: only the records
    that begin or end one are looked at, so the spans are made afterwards with every
    attribute at once (the SDK's cheapest path)."""
    steps: dict[str, _Step] = {}
    attempts: dict[str, _Attempt] = {}
    for record in records:
        kind = _KINDS.get(record.type)
        if kind is None:
            continue
        data = record.data
        if kind == _STEP_BEGINS:
            steps[data["step_key"]] = _Step(data, _ns(record))
        elif kind == _ATTEMPT_BEGINS:
            step = steps.get(data["step_key"])
            if step is not None:
                attempt = attempts[data["attempt_id"]] = _Attempt(data, _ns(record))
                step.attempts.append(attempt)
        else:
            ended: _Step | _Attempt | None = (
                attempts.get(data["attempt_id"]) if kind == _ATTEMPT_ENDS
                else steps.get(data["step_key"])
            )  # fmt: skip
            if ended is not None and ended.end_ns is None:
                ended.end_ns = _ns(record)
                ended.outcome = _OUTCOMES[record.type]
                ended.result_code = data.get("result_code")
    return list(steps.values())


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


def _with_code(attributes: dict[str, Any], result_code: str | None) -> dict[str, Any]:
    """`attributes` with qlflow.result_code when there is one (each attribute costs
    the SDK a validation: none is set empty)."""
    if result_code:
        attributes["qlflow.result_code"] = result_code
    return attributes


def _end(span: Span, outcome: str, result_code: str | None, end_ns: int) -> None:
    """End a span at the log's time; an outcome but success is an error (success
    leaves the status unset, as OpenTelemetry asks of an instrumentation library)."""
    if outcome not in _NOT_ERRORS:
        span.set_status(Status(StatusCode.ERROR, result_code or outcome))
    span.end(end_time=end_ns)


def trace_runs(rt: Runtime, tracer_provider: TracerProvider | None = None) -> RunTracing:
    """Trace every Run a commit of `rt` ends, with `tracer_provider` (default: the
    global one the host configured; qlflow never sets it)."""
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    return RunTracing(rt.store, provider.get_tracer("qlflow"))
