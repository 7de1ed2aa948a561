"""Task Attempt admission (SPEC §5–6): exact ready epoch, immutable admission, limits."""

from __future__ import annotations

import pytest

from domain.attempts import attempt_id_for, decide_attempt_claims
from domain.cancellation import request_cancel
from domain.errors import InvalidInput
from domain.ids import TASK_ATTEMPT, TASK_ATTEMPT_EVENT, derive_id
from domain.recovery import decide_recovery
from domain.streams import run_stream
from domain.transitions import MAX_ATTEMPTS_PER_STEP
from tests.domain.strategies import RUN_ID, TTL_MS, World, attempt_of, lease, make_plan

RUN = run_stream(RUN_ID)


def test_every_ready_step_gets_one_claimed_attempt_at_its_epoch():
    world = World(make_plan({"a": [], "b": [], "c": ["a"]}))
    decision = world.apply(decide_attempt_claims(world.agg, world.now_ms, "remote_worker"))
    events = decision.events(RUN)
    assert [e.type for e in events] == ["attempt.claimed", "attempt.claimed"]
    plan = world.agg.plan
    a = world.agg.steps["a"]
    claimed = events[0]
    attempt_id = derive_id(TASK_ATTEMPT, plan.plan_digest, a.step_run_id, 1)
    assert attempt_id == attempt_id_for(plan.plan_digest, a.step_run_id, 1)
    assert claimed.event_id == TASK_ATTEMPT_EVENT + attempt_id.removeprefix(TASK_ATTEMPT)
    assert claimed.data == {
        "attempt_id": attempt_id,
        "step_run_id": a.step_run_id,
        "step_key": "a",
        "step_epoch": 1,
        "attempt_number": 1,
        "admission": {
            "plan_digest": plan.plan_digest,
            "task_ref": "pkg@1#t-a",
            "task_id": "t-a",
            "source_digest": a.source_digest,
            "executor": "remote_worker",
        },
    }
    assert world.agg.steps["a"].status == "ready"  # claimed does not move the StepRun
    assert attempt_of(world, "a").status == "claimed"
    assert decide_attempt_claims(world.agg, world.now_ms).noop


def test_a_requeued_step_gets_a_new_attempt_against_its_new_epoch():
    world = World(make_plan({"a": []}))
    world.apply(decide_attempt_claims(world.agg, world.now_ms))
    first = attempt_of(world, "a")
    lease(world, "a")
    world.tick(TTL_MS)
    world.apply(decide_recovery(world.agg, world.now_ms))
    assert world.agg.steps["a"].epoch == 2
    world.apply(decide_attempt_claims(world.agg, world.now_ms))
    second = attempt_of(world, "a")
    assert second.attempt_id != first.attempt_id
    assert (second.step_epoch, second.attempt_number) == (2, 2)


def test_a_step_out_of_attempts_fails_with_attempts_exhausted():
    world = World(make_plan({"a": []}))
    for _ in range(MAX_ATTEMPTS_PER_STEP):
        world.apply(decide_attempt_claims(world.agg, world.now_ms))
        lease(world, "a")
        world.tick(TTL_MS)
        world.apply(decide_recovery(world.agg, world.now_ms))
    assert len(world.agg.steps["a"].attempt_ids) == MAX_ATTEMPTS_PER_STEP
    decision = world.apply(decide_attempt_claims(world.agg, world.now_ms))
    assert [e.type for e in decision.events(RUN)] == ["step.failed"]
    step = world.agg.steps["a"]
    assert (step.status, step.result_code) == ("failed", "attempts_exhausted")
    assert decision.settled_steps == 1


def test_no_admission_under_intent_deadline_or_terminal():
    world = World(make_plan({"a": []}, timeout_ms=30_000))
    assert decide_attempt_claims(world.agg, world.now_ms + 30_000).noop
    world.apply(request_cancel(world.agg, "shutdown", world.now_ms))
    assert decide_attempt_claims(world.agg, world.now_ms).noop


def test_unknown_executor_is_refused():
    world = World(make_plan({"a": []}))
    with pytest.raises(InvalidInput, match="executor"):
        decide_attempt_claims(world.agg, world.now_ms, "thread")


def test_admission_ids_do_not_depend_on_the_clock():
    world = World(make_plan({"a": [], "b": []}))
    early = decide_attempt_claims(world.agg, world.now_ms)
    late = decide_attempt_claims(world.agg, world.now_ms + 99)
    assert [e.event_id for e in early.events(RUN)] == [e.event_id for e in late.events(RUN)]
    assert [e.data for e in early.events(RUN)] == [e.data for e in late.events(RUN)]
