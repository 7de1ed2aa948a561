"""Plan v2 through the public API on both stores: parameters validated and bound,
outputs handed downstream, and the retry policy's rules."""

from __future__ import annotations

import pytest

import qlflow
from qlflow.errors import AdmissionCollision, InvalidInput

T0 = 1_800_000_000_000
TTL = 30_000


def manifest(max_attempts: int = 3, backoff_ms: int = 1_000, timeout_ms: int | None = None):
    workflow = {
        "params": {
            "date": {"type": "string", "description": "the day"},
            "limit": {"type": "integer", "default": 10},
            "dry": {"type": "boolean", "default": False},
        },
        "steps": [
            {"key": "fetch", "task": "fetch"},
            {
                "key": "load",
                "task": "load",
                "needs": ["fetch"],
                "retry": {"max_attempts": max_attempts, "backoff_ms": backoff_ms},
            },
        ],
    }
    if timeout_ms is not None:
        workflow["timeout_ms"] = timeout_ms
    return {
        "package": {"name": "daily", "publisher": "acme"},
        "tasks": {
            "fetch": {"command": ["python3", "fetch.py"], "env": {"MODE": "x"}},
            "load": {"command": ["sh", "-c", "exit 0"]},
        },
        "workflows": {"nightly": workflow},
    }


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def _event_count(rt) -> int:
    return len(rt.events())


def test_params_are_validated_and_bound_into_the_plan(rt):
    rt.publish(manifest(), now_ms=T0)
    one = rt.start("daily", "nightly", admission_key="k1", params={"date": "2026-12-01"}, now_ms=T0)
    two = rt.start("daily", "nightly", admission_key="k2", params={"date": "2026-12-02"}, now_ms=T0)
    assert one.plan_digest != two.plan_digest
    assert rt.get_run(one.run_id).params == {"date": "2026-12-01", "limit": 10, "dry": False}
    again = rt.start(
        "daily", "nightly", admission_key="k1", params={"date": "2026-12-01", "limit": 10}
    )
    assert (again.status, again.run_id) == ("existing", one.run_id)
    with pytest.raises(AdmissionCollision):
        rt.start("daily", "nightly", admission_key="k1", params={"date": "2026-12-09"})
    before = _event_count(rt)
    for bad, field in (
        ({"date": "x", "nope": 1}, "params.nope"),
        ({"date": 3}, "params.date"),
        ({"date": "x", "limit": "10"}, "params.limit"),
        ({}, "params.date"),
    ):
        with pytest.raises(InvalidInput) as caught:
            rt.start("daily", "nightly", admission_key="k3", params=bad, now_ms=T0)
        assert caught.value.field == field
    assert _event_count(rt) == before
    assert rt.inspect_admission(admission_key="k3") is None


def _lease(rt, now_ms: int, step_key: str | None = None):
    leases = rt.lease_attempts("w1", ttl_ms=TTL, now_ms=now_ms, step_key=step_key)
    assert len(leases) == 1, leases
    return leases[0]


def _run(rt, now_ms: int, outcome: str, output=None, step_key=None):
    lease = _lease(rt, now_ms, step_key)
    lease = rt.mark_running(lease, now_ms=now_ms)
    rt.complete(lease, outcome, output=output, now_ms=now_ms)
    return lease


def test_outputs_reach_the_dependent_and_a_retried_step_waits_its_backoff(rt):
    rt.publish(manifest(max_attempts=3, backoff_ms=1_000), now_ms=T0)
    run_id = rt.start("daily", "nightly", params={"date": "2026-12-01"}, now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    _run(rt, T0, "succeeded", {"rows": 7})
    rt.cycle(now_ms=T0 + 1)
    lease = _lease(rt, T0 + 1)
    assert rt.task_inputs(lease) == {
        "params": {"date": "2026-12-01", "dry": False, "limit": 10},
        "needs": {"fetch": {"rows": 7}},
    }
    definition = rt.task_definition(lease)
    assert definition.command == ("sh", "-c", "exit 0") and definition.task_id == "load"
    lease = rt.mark_running(lease, now_ms=T0 + 2)
    rt.complete(lease, "failed", now_ms=T0 + 2)
    step = rt.get_run(run_id).steps["load"]
    assert (step.status, step.retry_at_ms, step.max_attempts) == ("ready", T0 + 1_002, 3)

    rt.cycle(now_ms=T0 + 1_001)  # before retry_at_ms: no Attempt
    assert rt.lease_attempts("w1", now_ms=T0 + 1_001) == []
    rt.cycle(now_ms=T0 + 1_002)
    _run(rt, T0 + 1_002, "failed")
    assert rt.get_run(run_id).steps["load"].retry_at_ms == T0 + 1_002 + 2_000
    rt.cycle(now_ms=T0 + 3_001)
    assert rt.lease_attempts("w1", now_ms=T0 + 3_001) == []
    rt.cycle(now_ms=T0 + 3_002)
    _run(rt, T0 + 3_002, "succeeded", {"loaded": 7})
    rt.cycle(now_ms=T0 + 3_003)
    run = rt.get_run(run_id)
    assert run.status == "succeeded"
    load = run.steps["load"]
    assert [a.status for a in load.attempts] == ["failed", "failed", "succeeded"]
    assert load.output == {"loaded": 7}
    assert run.steps["fetch"].output == {"rows": 7}
    rt.rebuild_projections()
    assert rt.verify_projections().ok


def _retry_under_a_workflow_deadline(rt, backoff_ms: int, timeout_ms: int, status: str) -> None:
    """A retry under a Workflow deadline: claimable from its retry time exactly, until
    the deadline, and the cycle's index finds it (its window once came out empty)."""
    rt.publish(manifest(max_attempts=3, backoff_ms=backoff_ms, timeout_ms=timeout_ms), now_ms=T0)
    run_id = rt.start("daily", "nightly", params={"date": "d"}, now_ms=T0).run_id
    deadline = T0 + timeout_ms
    rt.cycle(now_ms=T0)
    _run(rt, T0, "succeeded")
    rt.cycle(now_ms=T0 + 1)
    _run(rt, T0 + 1, "failed")
    retry_at = rt.get_run(run_id).steps["load"].retry_at_ms
    assert retry_at == T0 + 1 + backoff_ms
    rt.cycle(now_ms=retry_at - 1)
    assert rt.lease_attempts("w1", now_ms=retry_at - 1) == []
    now = retry_at
    while rt.get_run(run_id).status == "running" and now <= deadline + 1:
        rt.cycle(now_ms=now)
        if now < deadline:
            _run(rt, now, "succeeded")
        now = max(now + 1, deadline if now < deadline else now + 1)
    run = rt.get_run(run_id)
    assert run.status == status, (run.status, retry_at, deadline)
    if status == "succeeded":
        assert [a.status for a in run.steps["load"].attempts] == ["failed", "succeeded"]
    else:
        assert run.steps["load"].status == "timed_out"


def test_a_retry_before_the_workflow_deadline_runs_and_succeeds(rt):
    _retry_under_a_workflow_deadline(rt, 1_000, 60_000, "succeeded")


def test_a_retry_due_1_ms_past_the_workflow_deadline_times_out(rt):
    _retry_under_a_workflow_deadline(rt, 1_000, 1_000, "timed_out")


def test_a_retry_due_far_past_the_workflow_deadline_times_out(rt):
    _retry_under_a_workflow_deadline(rt, 600_000, 60_000, "timed_out")


def test_a_step_that_exhausts_its_attempts_fails_the_run(rt):
    rt.publish(manifest(max_attempts=2, backoff_ms=0), now_ms=T0)
    run_id = rt.start("daily", "nightly", params={"date": "d"}, now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    _run(rt, T0, "succeeded")
    for at in (T0 + 1, T0 + 2):
        rt.cycle(now_ms=at)
        _run(rt, at, "failed")
    rt.cycle(now_ms=T0 + 3)
    run = rt.get_run(run_id)
    assert run.status == "failed"
    assert run.steps["load"].status == "failed"
    assert len(run.steps["load"].attempts) == 2


def test_a_lost_attempt_past_the_barrier_is_not_retried(rt):
    rt.publish(manifest(max_attempts=3, backoff_ms=0), now_ms=T0)
    run_id = rt.start("daily", "nightly", params={"date": "d"}, now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    _run(rt, T0, "succeeded")
    rt.cycle(now_ms=T0 + 1)
    rt.mark_starting(_lease(rt, T0 + 1), now_ms=T0 + 1)
    for at in (T0 + 1 + TTL, T0 + 2 + TTL):
        rt.cycle(now_ms=at)
    run = rt.get_run(run_id)
    assert run.steps["load"].status == "failed"
    assert run.steps["load"].result_code == "lease_expired"
    assert [a.status for a in run.steps["load"].attempts] == ["lost"]
    assert run.status == "failed"


def test_a_cancel_while_a_step_waits_for_its_retry_settles_it_cancelled(rt):
    rt.publish(manifest(max_attempts=3, backoff_ms=60_000), now_ms=T0)
    run_id = rt.start("daily", "nightly", params={"date": "d"}, now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    _run(rt, T0, "succeeded")
    rt.cycle(now_ms=T0 + 1)
    _run(rt, T0 + 1, "failed")
    assert rt.cancel(run_id, now_ms=T0 + 2)
    rt.cycle(now_ms=T0 + 3)
    run = rt.get_run(run_id)
    assert run.steps["load"].status == "cancelled"
    assert run.status == "cancelled"


def test_why_says_which_retry_comes_when(rt):
    rt.publish(manifest(max_attempts=3, backoff_ms=5_000), now_ms=T0)
    run_id = rt.start("daily", "nightly", params={"date": "d"}, now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    _run(rt, T0, "succeeded")
    rt.cycle(now_ms=T0 + 1)
    _run(rt, T0 + 1, "failed")
    lines = rt.why(run_id, now_ms=T0 + 2).lines()
    assert f"step 'load' is ready (waiting: retry 2 of 3 at {T0 + 5_001})" in "\n".join(lines)


def test_an_output_over_64_kib_is_refused_and_nothing_is_written(rt):
    rt.publish(manifest(), now_ms=T0)
    rt.start("daily", "nightly", params={"date": "d"}, now_ms=T0)
    rt.cycle(now_ms=T0)
    lease = rt.mark_running(_lease(rt, T0), now_ms=T0)
    before = _event_count(rt)
    with pytest.raises(InvalidInput) as caught:
        rt.complete(lease, "succeeded", output={"blob": "x" * 65_536}, now_ms=T0)
    assert caught.value.rule == "output_size"
    assert _event_count(rt) == before
