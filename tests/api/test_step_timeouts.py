"""Step timeouts through the public API on both stores, with explicit instants
(docs/DESIGN.md, "Step timeouts"): the plan binds them, the lease carries the
deadline, a renewal past it says `step_timed_out`, a `timed_out` completion is
recorded `step_timeout` and retried, and a host that is gone loses its Attempt as
before."""

from __future__ import annotations

import pytest

import qlflow
from qlflow.errors import InvalidInput, ManifestError

T0 = 1_800_000_000_000
TTL = 30_000
STEP_TIMEOUT = 5_000


def manifest(step_timeout=STEP_TIMEOUT, task_timeout=None, workflow_timeout=60_000, retries=2):
    work = {"key": "work", "task": "work", "retry": {"max_attempts": retries, "backoff_ms": 0}}
    if step_timeout is not None:
        work["timeout_ms"] = step_timeout
    task = {"command": ["sleep", "600"]}
    if task_timeout is not None:
        task["timeout_ms"] = task_timeout
    workflow = {"steps": [work, {"key": "after", "task": "after", "needs": ["work"]}]}
    if workflow_timeout is not None:
        workflow["timeout_ms"] = workflow_timeout
    return {
        "package": {"name": "slow", "publisher": "acme"},
        "tasks": {"work": task, "after": {"command": ["true"]}},
        "workflows": {"flow": workflow},
    }


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def _lease_work(rt, now_ms: int):
    (lease,) = rt.lease_attempts("w1", ttl_ms=TTL, now_ms=now_ms, start=True)
    assert lease.step_key == "work"
    return lease


def test_the_lease_carries_the_deadline_and_a_renewal_past_it_says_so(rt):
    rt.publish(manifest(), now_ms=T0)
    run_id = rt.start("slow", "flow", admission_key="k", now_ms=T0).run_id
    lease = _lease_work(rt, T0 + 10)
    assert lease.step_deadline_ms == T0 + 10 + STEP_TIMEOUT
    lease = rt.renew(lease, ttl_ms=TTL, now_ms=T0 + 10 + STEP_TIMEOUT - 1)
    assert not lease.step_timed_out and lease.step_deadline_ms == T0 + 10 + STEP_TIMEOUT
    with pytest.raises(InvalidInput):  # not past it yet: the domain refuses the outcome
        rt.complete(lease, "timed_out", now_ms=T0 + 10 + STEP_TIMEOUT - 1)
    lease = rt.renew(lease, ttl_ms=TTL, now_ms=T0 + 10 + STEP_TIMEOUT)
    assert lease.step_timed_out and not lease.stop_requested
    assert rt.complete(lease, "timed_out", now_ms=T0 + 20 + STEP_TIMEOUT) == "timed_out"
    view = rt.get_run(run_id)
    (first, second) = view.steps["work"].attempts
    assert (first.status, first.result_code) == ("timed_out", "step_timeout")
    assert second.status == "claimed"  # retried at once (backoff 0)
    # the retry's Attempt gets a new clock from its own start barrier
    again = _lease_work(rt, T0 + 30_000)
    assert again.step_deadline_ms == T0 + 30_000 + STEP_TIMEOUT
    rt.complete(again, "succeeded", now_ms=T0 + 31_000)
    rt.cycle(now_ms=T0 + 31_000)
    (after,) = rt.lease_attempts("w1", ttl_ms=TTL, now_ms=T0 + 31_000, start=True)
    assert after.step_deadline_ms is None  # no timeout on that step
    rt.complete(after, "succeeded", now_ms=T0 + 31_500)
    assert rt.get_run(run_id).status == "succeeded"
    assert rt.verify_projections().ok


def test_why_says_when_a_running_step_times_out_and_that_it_passed_it(rt):
    rt.publish(manifest(), now_ms=T0)
    run_id = rt.start("slow", "flow", admission_key="k", now_ms=T0).run_id
    lease = rt.mark_running(_lease_work(rt, T0), now_ms=T0 + 1)
    before = rt.why(run_id, now_ms=T0 + 1_000)
    (block,) = before.blocked
    assert block.step_deadline_ms == T0 + STEP_TIMEOUT and not block.past_step_timeout
    assert "its step times out at" in "\n".join(before.lines())
    lease = rt.renew(lease, ttl_ms=TTL, now_ms=T0 + STEP_TIMEOUT + 1)
    after = rt.why(run_id, now_ms=T0 + STEP_TIMEOUT + 1)
    (block,) = after.blocked
    assert block.past_step_timeout
    assert "passed its step's timeout" in "\n".join(after.lines())
    rt.complete(lease, "timed_out", now_ms=T0 + STEP_TIMEOUT + 2)
    (failure,) = rt.why(run_id, now_ms=T0 + STEP_TIMEOUT + 3).failures
    # a step timeout counts against max_attempts as the retry policy counts it
    assert (failure.result_code, failure.retry, failure.max_attempts) == ("step_timeout", 2, 2)


def test_the_last_allowed_attempt_timed_out_times_the_step_out(rt):
    rt.publish(manifest(retries=1), now_ms=T0)
    run_id = rt.start("slow", "flow", admission_key="k", now_ms=T0).run_id
    lease = _lease_work(rt, T0)
    rt.complete(lease, "timed_out", now_ms=T0 + STEP_TIMEOUT)
    rt.cycle(now_ms=T0 + STEP_TIMEOUT)
    view = rt.get_run(run_id)
    assert (view.steps["work"].status, view.steps["work"].result_code) == (
        "timed_out",
        "step_timeout",
    )
    assert view.steps["after"].status == "skipped"
    assert view.terminal


def test_a_task_timeout_applies_to_the_steps_that_declare_none(rt):
    rt.publish(manifest(step_timeout=None, task_timeout=2_000), now_ms=T0)
    rt.start("slow", "flow", admission_key="k", now_ms=T0)
    assert _lease_work(rt, T0).step_deadline_ms == T0 + 2_000


def test_a_host_that_is_gone_loses_its_attempt_as_before(rt):
    rt.publish(manifest(retries=1), now_ms=T0)
    run_id = rt.start("slow", "flow", admission_key="k", now_ms=T0).run_id
    _lease_work(rt, T0)  # the host vanishes: nobody stops it, nobody renews
    rt.cycle(now_ms=T0 + TTL)  # the lease ran out long after the step's timeout
    work = rt.get_run(run_id).steps["work"]
    assert work.attempts[0].status == "lost"
    assert (work.status, work.result_code) == ("failed", "lease_expired")


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"step_timeout": 999}, "steps[0].timeout_ms"),
        ({"step_timeout": 60_001}, "steps[0].timeout_ms"),
        ({"step_timeout": "5s"}, "steps[0].timeout_ms"),
        ({"step_timeout": None, "task_timeout": 500}, "[tasks.work] timeout_ms"),
        ({"step_timeout": None, "task_timeout": 90_000}, "[tasks.work] timeout_ms"),
    ],
)
def test_a_bad_step_timeout_is_refused_at_publish_with_nothing_written(rt, changes, where):
    with pytest.raises(ManifestError) as refused:
        rt.publish(manifest(**changes), now_ms=T0)
    assert where in str(refused.value)
    assert rt.events() == []
