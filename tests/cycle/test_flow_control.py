"""Flow control through the public API, on SQLite and PostgreSQL (docs/DESIGN.md,
"Flow control"): Task limits (plain and keyed) enforced at lease time, freed by a
completion or by the lease's expiry, changed at runtime; Workflow limits with their
durable queue; lease order by priority, then Run by Run; bad input refused with
nothing written; and the read models equal to a replay of the log after it all."""

from __future__ import annotations

import pytest

import qlflow
from domain.event_types import EventType
from qlflow.errors import InvalidInput
from tests.cycle.helpers import T0

TTL_MS = 5_000


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


def package(task_limit=None, workflow: dict | None = None, params: bool = False) -> dict:
    """Package `etl`: Workflow `w` runs a (Task `a`, limited by `task_limit`) then b."""
    tasks: dict = {"a": {"command": ["true"]}, "b": {"command": ["true"]}}
    if task_limit is not None:
        tasks["a"]["concurrency"] = task_limit
    table: dict = {"steps": [{"key": "a", "task": "a"}, {"key": "b", "task": "b", "needs": ["a"]}]}
    table.update(workflow or {})
    if params:
        table["params"] = {"region": {"type": "string", "default": "eu"}}
    return {
        "package": {"name": "etl", "publisher": "acme"},
        "tasks": tasks,
        "workflows": {"w": table},
    }


def start(rt, count: int, at_ms: int = T0, **options) -> list[str]:
    return [rt.start("etl", "w", now_ms=at_ms + i, **options).run_id for i in range(count)]


def finish(rt, lease, at_ms: int) -> None:
    rt.mark_running(lease, now_ms=at_ms)
    rt.complete(lease, "succeeded", now_ms=at_ms)


def leased_a(rt, at_ms: int) -> list[str]:
    """The Attempts of step a whose lease holds at `at_ms`, per the limits listing."""
    return sorted(
        h.attempt_id
        for view in rt.limits(now_ms=at_ms)
        for h in view.holders
        if h.attempt_id is not None
    )


def test_a_task_limit_caps_leases_and_a_completion_frees_its_slot(rt):
    rt.publish(package(task_limit=2), now_ms=T0)
    runs = start(rt, 5)
    first = rt.lease_attempts("w1", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 10)
    assert [(lease.run_id, lease.step_key) for lease in first] == [(runs[0], "a"), (runs[1], "a")]
    assert rt.lease_attempts("w2", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 11) == []
    assert len(leased_a(rt, T0 + 11)) == 2
    finish(rt, first[0], T0 + 12)
    # Run 0's b (no limit) comes first, then the slot a completion freed
    again = rt.lease_attempts("w2", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 13)
    assert [(lease.run_id, lease.step_key) for lease in again] == [(runs[0], "b"), (runs[2], "a")]
    assert rt.verify_projections().ok


def test_an_expired_lease_frees_its_slot_with_no_write(rt):
    rt.publish(package(task_limit=1), now_ms=T0)
    runs = start(rt, 3)
    [held] = rt.lease_attempts("w1", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 10)
    assert rt.lease_attempts("w2", limit=10, ttl_ms=TTL_MS, now_ms=held.expires_at_ms - 1) == []
    position = rt.store.head_position()
    # the worker vanished: at its lease's expiry the slot is free, nothing was written
    assert leased_a(rt, held.expires_at_ms) == []
    assert rt.store.head_position() == position
    [taken] = rt.lease_attempts("w2", limit=10, ttl_ms=TTL_MS, now_ms=held.expires_at_ms)
    assert taken.run_id == runs[0]  # the oldest Run's claim, granted again
    assert rt.verify_projections().ok


def test_a_limit_set_at_runtime_is_in_force_at_the_next_lease_and_recorded(rt):
    rt.publish(package(task_limit=1), now_ms=T0)
    start(rt, 4)
    assert len(rt.lease_attempts("w1", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 10)) == 1
    change = rt.set_limit("task:etl/a", 3, by="ops", now_ms=T0 + 11)
    assert (change.old, change.new, change.changed, change.set_by) == (1, 3, True, "ops")
    assert len(rt.lease_attempts("w1", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 12)) == 2
    [view] = [v for v in rt.limits(now_ms=T0 + 13) if v.target == "task:etl/a"]
    assert (view.declared, view.set_to, view.limit, view.in_use, view.waiting) == (1, 3, 3, 3, 1)
    assert {h.worker_id for h in view.holders} == {"w1"}
    [record] = [r for r in rt.store.iter_all() if r.type == EventType.LIMIT_SET]
    assert record.data == {"target": "task:etl/a", "old": 1, "new": 3, "set_at_ms": T0 + 11}
    assert record.metadata["actor"] == "ops"
    assert not rt.set_limit("task:etl/a", 3, now_ms=T0 + 14).changed  # nothing to write
    assert rt.verify_projections().ok


def test_a_keyed_limit_has_one_set_of_slots_per_key_value(rt):
    rt.publish(package(task_limit={"limit": 1, "key": "{params.region}"}, params=True), now_ms=T0)
    eu = start(rt, 2, params={"region": "eu"})
    us = start(rt, 2, at_ms=T0 + 5, params={"region": "us"})
    leases = rt.lease_attempts("w1", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 10)
    assert sorted(lease.run_id for lease in leases) == sorted([eu[0], us[0]])
    rt.set_limit("task:etl/a[us]", 2, now_ms=T0 + 11)
    [more] = rt.lease_attempts("w1", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 12)
    assert more.run_id == us[1]
    targets = {v.target: v for v in rt.limits(now_ms=T0 + 13)}
    assert targets["task:etl/a[eu]"].in_use == 1 and targets["task:etl/a[eu]"].waiting == 1
    assert targets["task:etl/a[us]"].limit == 2 and targets["task:etl/a"].in_use == 3


def test_workers_lease_higher_priority_first_then_run_by_run(rt):
    rt.publish(package(), now_ms=T0)
    runs = start(rt, 3)
    urgent = rt.start("etl", "w", priority=5, now_ms=T0 + 50).run_id
    [first] = rt.lease_attempts("w1", limit=1, ttl_ms=TTL_MS, now_ms=T0 + 60)
    assert first.run_id == urgent
    finish(rt, first, T0 + 61)
    order = []
    for at in range(T0 + 62, T0 + 70):
        found = rt.lease_attempts("w1", limit=1, ttl_ms=TTL_MS, now_ms=at)
        if not found:
            break
        order.append((found[0].run_id, found[0].step_key))
        finish(rt, found[0], at)
    # the urgent Run's b, then each older Run to its end before the next one starts
    assert order == [
        (urgent, "b"),
        (runs[0], "a"),
        (runs[0], "b"),
        (runs[1], "a"),
        (runs[1], "b"),
        (runs[2], "a"),
        (runs[2], "b"),
    ]
    assert all(rt.get_run(r).status == "succeeded" for r in [*runs, urgent])


def test_max_running_queues_runs_and_admits_them_in_order(rt):
    rt.publish(package(workflow={"max_running": 1}), now_ms=T0)
    runs = start(rt, 3)
    late_but_urgent = rt.start("etl", "w", priority=9, now_ms=T0 + 20).run_id
    leases = rt.lease_attempts("w1", limit=10, ttl_ms=TTL_MS, now_ms=T0 + 30)
    assert [lease.run_id for lease in leases] == [runs[0]]  # the others claim nothing
    [view] = [v for v in rt.limits(now_ms=T0 + 30) if v.target == "workflow:etl/w"]
    assert (view.in_use, view.waiting, view.holders[0].run_id) == (1, 3, runs[0])
    finish(rt, leases[0], T0 + 30)
    at = T0 + 31
    ended = []
    for _ in range(12):
        rt.cycle(now_ms=at)
        for lease in rt.lease_attempts("w1", limit=10, ttl_ms=TTL_MS, now_ms=at):
            finish(rt, lease, at)
        at += 1
        ended += [r for r in [*runs, late_but_urgent] if r not in ended and _ended(rt, r)]
    # one at a time: the higher priority first, then by admission
    assert ended == [runs[0], late_but_urgent, runs[1], runs[2]]
    assert rt.verify_projections().ok


def _ended(rt, run_id: str) -> bool:
    return rt.get_run(run_id).status != "running"


def test_a_queued_run_is_cancelled_or_times_out_without_taking_a_slot(rt):
    rt.publish(package(workflow={"max_running": 1}), now_ms=T0)
    [holder, cancelled] = start(rt, 2)
    timing_out = rt.start("etl", "w", timeout_ms=1_000, now_ms=T0 + 5).run_id
    rt.cancel(cancelled, now_ms=T0 + 10)
    assert rt.get_run(cancelled).status == "cancelled"
    rt.cycle(now_ms=T0 + 2_000)
    assert rt.get_run(timing_out).status == "timed_out"
    assert rt.get_run(holder).status == "running"
    views = [v for v in rt.limits(now_ms=T0 + 2_000) if v.target == "workflow:etl/w"]
    assert (views[0].in_use, views[0].waiting) == (1, 0)
    assert rt.verify_projections().ok


def test_bad_flow_input_is_refused_with_its_field_and_writes_nothing(rt):
    rt.publish(package(task_limit=2), now_ms=T0)
    position = rt.store.head_position()
    for call, field in (
        (lambda: rt.start("etl", "w", priority=1_001, now_ms=T0 + 1), "priority"),
        (lambda: rt.start("etl", "w", priority=-1_001, now_ms=T0 + 1), "priority"),
        (lambda: rt.start("etl", "w", priority="high", now_ms=T0 + 1), "priority"),
        (lambda: rt.set_limit("task:etl/a", 0, now_ms=T0 + 1), "limit"),
        (lambda: rt.set_limit("task:etl/a", 10_001, now_ms=T0 + 1), "limit"),
        (lambda: rt.set_limit("task:etl/b", 3, now_ms=T0 + 1), "target"),
        (lambda: rt.set_limit("task:etl/a[eu]", 3, now_ms=T0 + 1), "target"),
        (lambda: rt.set_limit("workflow:etl/w", 3, now_ms=T0 + 1), "target"),
        (lambda: rt.set_limit("etl/a", 3, now_ms=T0 + 1), "target"),
    ):
        with pytest.raises(InvalidInput) as refused:
            call()
        assert refused.value.field == field, refused.value
    assert rt.store.head_position() == position
