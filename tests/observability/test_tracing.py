"""The span tree of a diamond Run (examples/diamond's shape: c fails, d is skipped),
made from the log with the SDK's in-memory exporter, on both stores."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import qlflow
from qlflow import trace_context, tracing
from tests.cli.helpers import EXAMPLES
from tests.cycle.helpers import DIAMOND, T0, drive, manifest


@pytest.fixture
def traced(store_url):
    rt = qlflow.open(store_url)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runs = tracing.trace_runs(rt, tracer_provider=provider)
    yield rt, runs, exporter
    runs.close()
    rt.close()


def test_a_diamond_run_is_one_trace_of_run_steps_and_attempts(traced):
    rt, runs, exporter = traced
    rt.publish(EXAMPLES / "diamond", now_ms=T0)
    run_id = rt.start("diamond", "diamond", admission_key="k", now_ms=T0).run_id
    # the steps' outcomes as the example's commands give them: c exits 1
    drive(rt, T0 + 10, outcomes={"c": "failed"})
    runs.flush()
    spans = exporter.get_finished_spans()
    by_name = {span.name: span for span in spans}
    assert sorted(by_name) == [
        "qlflow.attempt a #1", "qlflow.attempt b #1", "qlflow.attempt c #1",
        "qlflow.run diamond/diamond",
        "qlflow.step a", "qlflow.step b", "qlflow.step c", "qlflow.step d",
    ]  # fmt: skip
    root = by_name["qlflow.run diamond/diamond"]
    # its parent is the Run's remote root, ids derived from the run id (what the
    # Attempts' processes were told as TRACEPARENT)
    assert root.parent.is_remote
    assert root.parent.span_id == trace_context.root_span_id(run_id)
    assert root.context.trace_id == trace_context.trace_id(run_id)
    assert {span.context.trace_id for span in spans} == {root.context.trace_id}
    assert root.attributes["qlflow.run_id"] == run_id
    assert root.attributes["qlflow.plan_digest"] == rt.get_run(run_id).plan_digest
    assert (root.attributes["qlflow.outcome"], root.status.status_code) == (
        "failed", StatusCode.ERROR,
    )  # fmt: skip
    for key in "abcd":
        assert by_name[f"qlflow.step {key}"].parent.span_id == root.context.span_id
    for key in "abc":
        attempt = by_name[f"qlflow.attempt {key} #1"]
        step = by_name[f"qlflow.step {key}"]
        assert attempt.parent.span_id == step.context.span_id
        assert step.attributes["qlflow.task_ref"] == f"diamond@1#{key}"
        attempt_id = attempt.attributes["qlflow.attempt_id"]
        told = trace_context.traceparent(run_id, attempt_id)
        assert attempt.attributes["qlflow.traceparent"] == told
        assert told.split("-")[1] == f"{root.context.trace_id:032x}"
        assert step.start_time <= attempt.start_time <= attempt.end_time <= step.end_time
    outcomes = {key: by_name[f"qlflow.step {key}"].attributes["qlflow.outcome"] for key in "abcd"}
    assert outcomes == {"a": "succeeded", "b": "succeeded", "c": "failed", "d": "skipped"}
    # anything but success is an error; success leaves the status unset (OpenTelemetry's
    # rule for an instrumentation library: OK is the application's to set)
    error, unset = StatusCode.ERROR, StatusCode.UNSET
    assert {span.name: span.status.status_code for span in spans} == {
        "qlflow.run diamond/diamond": error,
        "qlflow.step a": unset, "qlflow.step b": unset,
        "qlflow.step c": error, "qlflow.step d": error,
        "qlflow.attempt a #1": unset, "qlflow.attempt b #1": unset,
        "qlflow.attempt c #1": error,
    }  # fmt: skip
    failed_attempt = by_name["qlflow.attempt c #1"]
    assert failed_attempt.attributes["qlflow.outcome"] == "failed"
    assert failed_attempt.status.description == failed_attempt.attributes["qlflow.result_code"]
    # the times are the log's: admission at T0, the end within the drive
    assert root.start_time == T0 * 1_000_000
    assert root.end_time >= (T0 + 10) * 1_000_000


def test_the_global_provider_is_used_and_never_replaced(store_url):
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    rt = qlflow.open(store_url)
    runs = tracing.trace_runs(rt)
    try:
        rt.publish(manifest(DIAMOND), now_ms=T0)
        rt.start("demo", "flow", admission_key="k", now_ms=T0)
        drive(rt, T0)
        runs.flush()
    finally:
        runs.close()
        rt.close()
    assert trace.get_tracer_provider() is before


def test_qlflow_imports_no_opentelemetry_without_traces():
    import subprocess
    import sys

    probe = (
        "import sys, qlflow, qlflow.cli, qlflow.metrics, qlflow.event_log, qlflow.cli.hosting; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_run_begun_before_tracing_is_read_back_with_the_same_tree(store_url):
    """A Run whose first records this process did not see committed (another host
    admitted it, or tracing began later) is traced from its stream, read back."""
    rt = qlflow.open(store_url)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        rt.publish(manifest(DIAMOND), now_ms=T0)
        run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
        runs = tracing.trace_runs(rt, tracer_provider=provider)  # after the admission
        try:
            drive(rt, T0)
            runs.flush()
        finally:
            runs.close()
    finally:
        rt.close()
    spans = exporter.get_finished_spans()
    assert len(spans) == 1 + 4 + 4  # the Run, four steps, four Attempts
    assert {span.context.trace_id for span in spans} == {trace_context.trace_id(run_id)}
