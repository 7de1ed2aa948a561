"""Step timeouts in the domain (docs/DESIGN.md, "Step timeouts"): the plan binds them
only where declared, the start barrier records when the clock starts, a renewal says
when an Attempt is past it, and a `timed_out` completion is recorded `step_timeout`
and retried like a failure."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import InvalidInput, PlanError
from domain.plan import normalize, plan_to_dict
from domain.retries import reported_failures
from domain.revision import revision_from_json, revision_to_json
from domain.snapshot import aggregate_from_snapshot, snapshot_document
from domain.step_timeouts import (
    MIN_STEP_TIMEOUT_MS,
    past_step_timeout,
    step_deadline_ms,
    timeout_problem,
)
from domain.transitions import STEP_TIMEOUT
from domain.worker import complete, renew
from domain.workflows import WorkflowStepDefinition, workflow_semantic_digest
from tests.domain.strategies import RUN_ID, World, attempt_of, claim, make_plan, start
from tests.domain.test_plan import workflow
from tests.domain.test_plan_package import DIAMOND, revision
from tests.hypothesis_budget import examples

TIMEOUT = 3_000  # within the strategies' lease TTL
TTL = 30_000


def _world(retries=None) -> World:
    world = World(make_plan({"a": [], "b": ["a"]}, retries=retries, step_timeouts={"a": TIMEOUT}))
    claim(world)
    return world


def _started(world: World):
    grant = start(world, "a", running=True)
    return grant, attempt_of(world, "a")


def _renew(world: World, grant, at_ms: int):
    world.now_ms = at_ms
    decision = world.apply(
        renew(world.agg, grant.attempt_id, grant.lease_id, grant.version, TTL, at_ms)
    )
    assert decision.lease is not None
    return decision


def _complete(world: World, grant, outcome: str):
    return world.apply(
        complete(
            world.agg,
            grant.attempt_id,
            grant.lease_id,
            grant.version,
            outcome,
            None,
            None,
            world.now_ms,
        )
    )


def test_the_clock_starts_at_the_start_barrier_and_a_renewal_says_when_it_ran_out():
    world = _world()
    started_at = world.now_ms
    grant, attempt = _started(world)
    assert attempt.started_at_ms == started_at
    assert step_deadline_ms(world.agg, attempt.attempt_id) == started_at + TIMEOUT
    first = _renew(world, grant, started_at + TIMEOUT - 1)
    assert not first.step_timed_out
    assert not past_step_timeout(world.agg, attempt.attempt_id, started_at + TIMEOUT - 1)
    late = _renew(world, first.lease, started_at + TIMEOUT)
    assert late.step_timed_out and not late.stop_requested
    assert world.refold() == world.agg


def test_a_timed_out_completion_is_refused_before_the_deadline():
    world = _world()
    grant, _ = _started(world)
    world.now_ms += TIMEOUT - 1
    with pytest.raises(InvalidInput) as refused:
        complete(
            world.agg,
            grant.attempt_id,
            grant.lease_id,
            grant.version,
            "timed_out",
            None,
            None,
            world.now_ms,
        )
    assert refused.value.rule == "not_past_timeout"


def test_past_the_deadline_the_attempt_and_the_step_are_timed_out_with_step_timeout():
    world = _world()
    grant, attempt = _started(world)
    world.now_ms += TIMEOUT
    decision = _complete(world, grant, "timed_out")
    types = [e.type for e in decision.events(f"run-{RUN_ID}")]
    assert types[:2] == ["attempt.timed_out", "step.timed_out"]
    ended = world.agg.attempts[attempt.attempt_id]
    assert (ended.status, ended.result_code, ended.reported_outcome) == (
        "timed_out",
        STEP_TIMEOUT,
        "timed_out",
    )
    assert world.agg.steps["a"].result_code == STEP_TIMEOUT
    assert world.refold() == world.agg


def test_a_timed_out_attempt_is_retried_and_counts_as_a_failure():
    world = _world(retries={"a": (2, 1_000)})
    grant, first = _started(world)
    world.now_ms += TIMEOUT
    decision = _complete(world, grant, "timed_out")
    ready = [e for e in decision.events(f"run-{RUN_ID}") if e.type == "step.ready"]
    assert ready and ready[0].data["retry_at_ms"] == world.now_ms + 1_000
    assert reported_failures(world.agg, "a") == 1
    world.now_ms += 1_000
    claim(world)
    grant, second = _started(world)
    assert second.attempt_id != first.attempt_id
    assert second.started_at_ms == world.now_ms  # a new Attempt, a new clock
    world.now_ms += TIMEOUT
    _complete(world, grant, "timed_out")  # the last attempt: the step times out
    assert world.agg.steps["a"].status == "timed_out"
    assert world.refold() == world.agg


def test_a_step_without_a_timeout_is_never_past_one_and_records_no_start_time():
    world = World(make_plan({"a": []}))
    claim(world)
    grant, attempt = _started(world)
    assert attempt.started_at_ms is None
    assert step_deadline_ms(world.agg, attempt.attempt_id) is None
    assert not _renew(world, grant, world.now_ms + 4_999).step_timed_out


def test_a_snapshot_keeps_the_start_time_and_an_older_document_reads_without_it():
    world = _world()
    _, attempt = _started(world)
    document = snapshot_document(world.agg)
    assert aggregate_from_snapshot(document).attempts[attempt.attempt_id].started_at_ms == (
        attempt.started_at_ms
    )
    assert aggregate_from_snapshot(document) == world.agg
    plain = World(make_plan({"a": []}))
    claim(plain)
    _started(plain)
    old = snapshot_document(plain.agg)
    for raw in old["attempts"]:
        del raw["started_at_ms"]
    from domain.snapshot import _digest

    old["digest"] = _digest(old)
    assert aggregate_from_snapshot(old) == plain.agg


# --- the plan and the revision ----------------------------------------------------------


def _sealed(plan):
    """The plan with the digest its content gives (make_plan's is made up)."""
    document = plan_to_dict(plan)
    del document["plan_digest"]
    return normalize(document)


def test_a_plan_states_a_step_timeout_only_where_declared():
    without = _sealed(make_plan({"a": [], "b": ["a"]}))
    document = plan_to_dict(without)
    assert all("timeout_ms" not in step for step in document["steps"])
    timed = _sealed(make_plan({"a": [], "b": ["a"]}, step_timeouts={"a": TIMEOUT}))
    steps = plan_to_dict(timed)["steps"]
    assert steps[0]["timeout_ms"] == TIMEOUT and "timeout_ms" not in steps[1]
    assert timed.plan_digest != without.plan_digest
    assert normalize(plan_to_dict(timed)) == timed
    broken = plan_to_dict(timed)
    broken["steps"][0]["timeout_ms"] = 999
    with pytest.raises(PlanError) as refused:
        normalize(broken)
    assert refused.value.rule == "step_timeout"


def test_the_revision_and_the_workflow_digest_carry_a_step_timeout_only_where_declared():
    made = revision()
    (flow,) = made.workflows.values()
    timed_steps = tuple(
        dataclasses.replace(step, timeout_ms=TIMEOUT) if step.key == "fetch" else step
        for step in flow.steps
    )
    timed = revision(workflows=[dataclasses.replace(flow, steps=timed_steps)])
    document = revision_to_json(timed)
    stated = {s["key"]: s.get("timeout_ms") for s in document["workflows"][flow.key]["steps"]}
    assert stated == {key: TIMEOUT if key == "fetch" else None for key in DIAMOND}
    assert revision_from_json(document) == timed
    assert timed.revision_digest != made.revision_digest
    assert workflow_semantic_digest(timed.workflows[flow.key], timed.tasks) != (
        workflow_semantic_digest(flow, made.tasks)
    )
    # no timeout: the digest computed before step timeouts existed
    assert workflow_semantic_digest(workflow(DIAMOND, timeout_ms=60_000), made.tasks) == (
        workflow_semantic_digest(flow, made.tasks)
    )


def test_a_revision_refuses_a_step_timeout_below_a_second_or_above_the_workflows():
    (flow,) = revision().workflows.values()
    for bad in (MIN_STEP_TIMEOUT_MS - 1, 60_001):
        steps = tuple(
            WorkflowStepDefinition(s.key, s.task, s.needs, s.retry, bad) for s in flow.steps
        )
        with pytest.raises(PlanError) as refused:
            revision(workflows=[dataclasses.replace(flow, steps=steps)])
        assert refused.value.rule == "step_timeout"


@settings(max_examples=examples(200))
@given(
    timeout=st.one_of(st.integers(-(2**60), 2**60), st.booleans(), st.none(), st.text()),
    workflow_timeout=st.one_of(st.none(), st.integers(1, 2**40)),
)
def test_timeout_problem_accepts_exactly_the_integers_from_a_second_to_the_workflows(
    timeout, workflow_timeout
):
    valid = (
        type(timeout) is int
        and MIN_STEP_TIMEOUT_MS <= timeout <= 2**53 - 1
        and (workflow_timeout is None or timeout <= workflow_timeout)
    )
    assert (timeout_problem(timeout, workflow_timeout) is None) is valid
