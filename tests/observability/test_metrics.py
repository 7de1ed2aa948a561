"""Prometheus metrics after a known workload equal what the log says, on both stores."""

from __future__ import annotations

import sqlite3
from collections import Counter

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import qlflow
from domain import event_types
from domain.errors import StoreUnavailable
from domain.event_types import EventType, Family
from qlflow import metrics
from tests.cycle.helpers import DIAMOND, T0, drive, manifest
from tests.observability.workloads import eventful, retrying_diamond


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry, by name and labels."""
    text = generate_latest(metrics.registry()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def delta(before, after, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    now = {"ms": T0}
    handle = metrics.instrument(runtime, min_interval_s=0, clock=lambda: now["ms"])
    runtime.test_now = now
    yield runtime
    handle.close()
    runtime.close()


def test_counters_after_a_workload_equal_the_log(rt):
    before = scrape()
    head = rt.store.head_position()
    rt.publish(retrying_diamond(), now_ms=T0)
    run_ids = [rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0).run_id for i in range(3)]
    # c fails on every try: one retry, then the step fails, d is skipped, the Run fails
    drive(rt, T0, outcomes={"c": "failed"})
    after = scrape()

    records = [r for r in rt.store.iter_all(head)]
    types = Counter(r.type for r in records)
    step_ends = Counter(
        (r.data["step_key"], event_types.name(r.type))
        for r in records
        if event_types.family(r.type) == Family.STEP
        and event_types.name(r.type) in {"succeeded", "failed", "skipped"}
    )
    assert step_ends == {("a", "succeeded"): 3, ("b", "succeeded"): 3, ("c", "failed"): 3,
                         ("d", "skipped"): 3}  # fmt: skip
    for (step, outcome), count in step_ends.items():
        task = f"demo@1#{step}"
        finished = delta(before, after, "qlflow_steps_finished_total", task=task, outcome=outcome)
        assert finished == count
    retries = sum(
        1 for r in records if r.type == "step.ready" and r.data.get("retry_at_ms") is not None
    )
    assert retries == 3
    assert delta(before, after, "qlflow_step_retries_total", task="demo@1#c") == retries
    assert delta(before, after, "qlflow_leases_granted_total") == types[EventType.LEASE_GRANTED]
    assert delta(before, after, "qlflow_runs_admitted_total") == len(run_ids)
    assert delta(before, after, "qlflow_runs_finished_total", status="failed") == len(run_ids)
    commits = delta(before, after, "qlflow_store_commit_duration_seconds_count")
    assert commits >= 1 + len(run_ids) + types[EventType.LEASE_GRANTED] // 4
    assert delta(before, after, "qlflow_store_commit_round_trips_count") == commits
    for phase in ("recovery", "cancellation", "schedule", "frontier", "claim"):
        assert delta(before, after, "qlflow_cycle_phase_duration_seconds_count", phase=phase) >= 1
    # the store gauges: every Run failed, nothing waits or runs
    assert after[("qlflow_runs", (("status", "failed"),))] == len(run_ids)
    assert after[("qlflow_runs", (("status", "running"),))] == 0
    assert not [key for key in after if key[0] == "qlflow_attempts_queued"]


def counted_by_the_log(records) -> Counter:
    """What each counter should say, by name and labels, read from the records
    alone (the oracle: the log, not the metrics module's mapping)."""
    tasks = {}
    expected: Counter = Counter()
    for r in records:
        kind, data = r.type, r.data
        family, _, name = kind.partition(".")
        if kind == "workflow.admitted":
            expected[("qlflow_runs_admitted_total", ())] += 1
            run_id = r.stream_id.removeprefix("run-")
            tasks.update({(run_id, s["key"]): s["task_ref"] for s in data["plan"]["steps"]})
        elif kind == "lease.granted":
            expected[("qlflow_leases_granted_total", ())] += 1
        elif kind == "lease.released" and data["reason"] == "lease_expired":
            expected[("qlflow_lease_expiries_total", ())] += 1
        elif kind == "attempt.interrupted":
            expected[("qlflow_interruptions_total", ())] += 1
        elif kind == "schedule.fired":
            expected[("qlflow_schedule_fires_total", ())] += 1
        elif kind == "schedule.skipped":
            expected[("qlflow_schedule_skips_total", (("reason", data["reason"]),))] += 1
        elif family == "workflow" and name in {"succeeded", "failed", "cancelled", "timed_out"}:
            expected[("qlflow_runs_finished_total", (("status", name),))] += 1
        elif family == "step":
            task = tasks[(r.stream_id.removeprefix("run-"), data["step_key"])]
            if name in {"succeeded", "failed", "cancelled", "timed_out", "skipped"}:
                labels = (("outcome", name), ("task", task))
                expected[("qlflow_steps_finished_total", labels)] += 1
            elif kind == "step.ready" and data.get("retry_at_ms") is not None:
                expected[("qlflow_step_retries_total", (("task", task),))] += 1
    return expected


def test_every_counter_equals_the_log_after_expiries_interruptions_and_schedules(rt):
    """Every counter the metrics have, after a workload with a lease that expires, an
    interruption, a retry, a schedule fire and a skip, is what the log says."""
    before = scrape()
    head = rt.store.head_position()
    eventful(rt)
    after = scrape()
    expected = counted_by_the_log(rt.store.iter_all(head))
    counters = {key[0] for key in expected}
    assert counters == {
        "qlflow_runs_admitted_total",
        "qlflow_leases_granted_total",
        "qlflow_lease_expiries_total",
        "qlflow_interruptions_total",
        "qlflow_schedule_fires_total",
        "qlflow_schedule_skips_total",
        "qlflow_runs_finished_total",
        "qlflow_steps_finished_total",
        "qlflow_step_retries_total",
    }  # fmt: skip: the workload makes every kind
    moved = {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if key[0] in counters and after[key] != before.get(key, 0.0)
    }
    assert moved == expected
    assert expected[("qlflow_lease_expiries_total", ())] == 1
    assert expected[("qlflow_interruptions_total", ())] == 1
    assert expected[("qlflow_schedule_skips_total", (("reason", "late"),))] == 1


def test_queue_and_running_gauges_follow_claims_and_leases(rt):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    for i in range(2):
        rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0)
    rt.test_now["ms"] = T0 + 4_000
    found = scrape()
    task_a = (("task", "demo@1#a"),)
    assert found[("qlflow_attempts_queued", task_a)] == 2
    assert found[("qlflow_attempts_oldest_claim_age_seconds", task_a)] == 4.0
    assert found[("qlflow_runs", (("status", "running"),))] == 2
    [lease] = rt.lease_attempts("w1", limit=1, now_ms=T0 + 4_000, start=True)
    found = scrape()
    assert found[("qlflow_attempts_queued", task_a)] == 1
    assert found[("qlflow_attempts_running", task_a)] == 1
    # a lease that ran out puts its claim back in the queue, before recovery acts
    rt.test_now["ms"] = T0 + 4_000 + 31_000
    rt.complete(lease, "succeeded", now_ms=T0 + 5_000)
    found = scrape()
    assert found[("qlflow_attempts_queued", task_a)] == 1
    assert ("qlflow_attempts_running", task_a) not in found


def test_gauges_are_read_at_most_once_per_interval(store_url):
    runtime = qlflow.open(store_url)
    handle = metrics.instrument(runtime, min_interval_s=3600, clock=lambda: T0)
    try:
        assert scrape()[("qlflow_runs", (("status", "running"),))] == 0
        runtime.publish(manifest(DIAMOND), now_ms=T0)
        runtime.start("demo", "flow", admission_key="k", now_ms=T0)
        # within the interval the scrape answers what it read last
        assert scrape()[("qlflow_runs", (("status", "running"),))] == 0
    finally:
        handle.close()
        runtime.close()


def test_store_errors_are_counted_by_kind(tmp_path):
    path = tmp_path / "q.db"
    runtime = qlflow.open(f"sqlite:///{path}?busy_timeout_ms=50")
    handle = metrics.instrument(runtime)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        before = scrape()
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
        with pytest.raises(StoreUnavailable) as raised:
            runtime.publish(manifest(DIAMOND), now_ms=T0)
        holder.execute("ROLLBACK")
        after = scrape()
        kind = raised.value.reason
        assert delta(before, after, "qlflow_store_errors_total", kind=kind) == 1
    finally:
        holder.close()
        handle.close()
        runtime.close()


def test_run_counts_equal_the_runs_table_through_a_workload_and_a_rebuild(rt):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    run_ids = [rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0).run_id for i in range(4)]
    rt.cancel(run_ids[0], now_ms=T0)
    drive(rt, T0, outcomes={"b": "failed"})
    rt.start("demo", "flow", admission_key="still-running", now_ms=T0 + 1_000)

    def counted() -> dict[str, int]:
        return {status: n for status, n in rt.store.query(
            "SELECT status, COUNT(*) FROM runs GROUP BY status")}  # fmt: skip

    def gauge() -> dict[str, int]:
        return {labels[0][1]: value for (name, labels), value in scrape().items()
                if name == "qlflow_runs" and value}  # fmt: skip

    assert counted() == {"cancelled": 1, "failed": 3, "running": 1}
    assert gauge() == counted()
    rt.rebuild_projections()
    assert gauge() == counted() == {"cancelled": 1, "failed": 3, "running": 1}


def test_every_metric_is_named_by_the_prometheus_conventions(rt):
    """qlflow_ prefix, help text, counters exposed as _total, times in _seconds."""
    rt.publish(manifest(DIAMOND), now_ms=T0)
    rt.start("demo", "flow", admission_key="k", now_ms=T0)
    families = list(metrics.registry().collect())
    names = {family.name for family in families}
    assert {"qlflow_attempts_queued", "qlflow_attempts_oldest_claim_age_seconds",
            "qlflow_attempts_running", "qlflow_runs", "qlflow_steps_finished",
            "qlflow_step_retries", "qlflow_lease_expiries", "qlflow_interruptions",
            "qlflow_schedule_fires", "qlflow_schedule_skips",
            "qlflow_cycle_phase_duration_seconds", "qlflow_store_commit_duration_seconds",
            "qlflow_store_commit_round_trips", "qlflow_store_errors", "qlflow_host_slots",
            "qlflow_host_slots_in_use"} <= names  # fmt: skip
    for family in families:
        assert family.name.startswith("qlflow_") and family.documentation.strip(), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if "duration" in family.name or "age" in family.name:
            assert family.name.endswith("_seconds"), family.name
