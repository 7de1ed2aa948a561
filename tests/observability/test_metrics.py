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


def retrying_diamond() -> dict:
    """The diamond; step c may be tried twice (one retry at once)."""
    document = manifest(DIAMOND)
    for step in document["workflows"]["flow"]["steps"]:
        if step["key"] == "c":
            step["retry"] = {"max_attempts": 2, "backoff_ms": 0}
    return document


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
