"""Frontier (pending → ready | skipped) and terminal aggregation (SPEC §6)."""

from __future__ import annotations

import pytest

from domain.cancellation import request_cancel
from domain.errors import InvalidInput
from domain.frontier import aggregate_outcome, decide_frontier
from domain.streams import run_stream, steps_stream
from tests.domain.strategies import RUN_ID, World, claim, finish, force_step, make_plan

RUN = run_stream(RUN_ID)

CODES = {"failed": "execution_failed", "cancelled": "x", "timed_out": "x", "skipped": "x"}


def settle(world: World, key: str, status: str) -> None:
    """Bring root Step `key` (ready) to a terminal `status`."""
    if status == "succeeded":
        finish(world, key)
    else:
        force_step(world, key, status, CODES[status])


def statuses(world: World) -> dict[str, str]:
    return {key: step.status for key, step in world.agg.steps.items()}


def test_pending_becomes_ready_only_when_every_need_succeeded():
    world = World(make_plan({"a": [], "b": [], "c": ["a", "b"]}))
    claim(world)
    finish(world, "a")
    assert decide_frontier(world.agg, world.now_ms).noop
    finish(world, "b")
    decision = world.apply(decide_frontier(world.agg, world.now_ms))
    events = decision.events(RUN)
    assert [e.type for e in events] == ["step.ready"]
    assert events[0].data == {
        "step_run_id": world.agg.steps["c"].step_run_id,
        "step_key": "c",
        "from": "pending",
        "to": "ready",
        "epoch": 2,
        "result_code": None,
        "attempt_id": None,
    }
    mutation = decision.events(steps_stream(RUN_ID))[0]
    assert mutation.data["event_id"] == events[0].event_id
    assert mutation.data["run_version"] == decision.appends[0].expected_version + 1
    assert statuses(world)["c"] == "ready"


@pytest.mark.parametrize("need_status", ["failed", "cancelled", "timed_out", "skipped"])
def test_a_need_that_did_not_succeed_skips_the_dependant(need_status):
    world = World(make_plan({"a": [], "b": [], "c": ["a", "b"]}))
    settle(world, "a", need_status)
    decision = world.apply(decide_frontier(world.agg, world.now_ms))
    assert world.agg.steps["c"].status == "skipped"
    assert world.agg.steps["c"].result_code == "dependency_not_succeeded"
    assert decision.settled_steps == 1
    assert decision.run_terminal is None  # b is still ready


def test_skip_propagates_through_the_whole_dag_in_one_decision():
    # keys out of topological order on purpose: z -> m -> a -> q, z -> b
    needs = {"z": [], "m": ["z"], "a": ["m"], "q": ["a", "b"], "b": ["z"], "k": []}
    world = World(make_plan(needs))
    claim(world)
    finish(world, "k")
    finish(world, "z", outcome="failed")
    decision = world.apply(decide_frontier(world.agg, world.now_ms))
    assert {k: s for k, s in statuses(world).items()} == {
        "z": "failed", "m": "skipped", "a": "skipped", "q": "skipped", "b": "skipped",
        "k": "succeeded",
    }  # fmt: skip
    events = decision.events(RUN)
    assert [e.type for e in events] == ["step.skipped"] * 4 + ["workflow.failed"]
    assert events[-1].data == {
        "result_code": "workflow_step_failed",
        "error_code": "workflow_step_failed",
    }
    assert decision.run_terminal == "failed"
    assert world.agg.run.status == "failed"


def test_diamond_skips_only_what_cannot_succeed():
    world = World(make_plan({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}))
    claim(world)
    finish(world, "a")
    claim(world)
    finish(world, "b", outcome="failed")
    world.apply(decide_frontier(world.agg, world.now_ms))
    assert statuses(world) == {"a": "succeeded", "b": "failed", "c": "ready", "d": "skipped"}
    assert world.agg.run.status == "running"


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        (("succeeded", "succeeded"), ("succeeded", None)),
        (("succeeded", "failed"), ("failed", "workflow_step_failed")),
        (("skipped", "succeeded"), ("failed", "workflow_step_failed")),
        (("failed", "timed_out"), ("failed", "workflow_step_failed")),
        (("timed_out", "cancelled"), ("timed_out", "workflow_step_timed_out")),
        (("timed_out", "succeeded"), ("timed_out", "workflow_step_timed_out")),
        (("cancelled", "succeeded"), ("cancelled", "workflow_step_cancelled")),
        (("cancelled", "cancelled"), ("cancelled", "workflow_step_cancelled")),
    ],
)
def test_terminal_aggregation_table(outcomes, expected):
    world = World(make_plan({"a": [], "b": []}))
    claim(world)
    for key, status in zip(("a", "b"), outcomes, strict=True):
        if status == "succeeded":
            finish(world, key)
        else:
            # the claimed Attempt stays; a forced StepRun change is enough for the table
            force_step(world, key, status, CODES[status])
    decision = world.apply(decide_frontier(world.agg, world.now_ms))
    status, error_code = expected
    assert decision.run_terminal == status
    last = decision.events(RUN)[-1]
    assert last.type == f"workflow.{status}"
    assert last.data["error_code"] == error_code
    assert (world.agg.run.status, world.agg.run.error_code) == expected
    assert aggregate_outcome(outcomes) == expected


def test_aggregate_outcome_waits_for_every_step():
    assert aggregate_outcome(["succeeded", "running"]) is None
    assert aggregate_outcome(["failed", "pending"]) is None


def test_frontier_skips_a_run_with_intent_or_past_its_deadline_or_terminal():
    world = World(make_plan({"a": [], "b": ["a"]}, timeout_ms=10_000))
    claim(world)
    finish(world, "a")
    assert not decide_frontier(world.agg, world.now_ms).noop
    assert decide_frontier(world.agg, world.now_ms + 10_000).noop  # deadline reached
    world.apply(request_cancel(world.agg, "policy", world.now_ms))
    assert decide_frontier(world.agg, world.now_ms).noop


def test_terminal_run_is_left_alone():
    world = World(make_plan({"a": []}))
    claim(world)
    finish(world, "a")
    decision = world.apply(decide_frontier(world.agg, world.now_ms))
    assert decision.run_terminal == "succeeded"
    assert decision.events(RUN)[-1].data == {"result_code": None, "error_code": None}
    assert decide_frontier(world.agg, world.now_ms).noop


def test_frontier_is_deterministic_and_independent_of_the_clock():
    world = World(make_plan({"a": [], "b": ["a"], "c": ["a"]}))
    claim(world)
    finish(world, "a", outcome="failed")
    first = decide_frontier(world.agg, world.now_ms)
    assert first == decide_frontier(world.agg, world.now_ms)
    later = decide_frontier(world.agg, world.now_ms + 12_345)
    ids = [e.event_id for a in first.appends for e in a.events]
    assert ids == [e.event_id for a in later.appends for e in a.events]


def test_frontier_refuses_a_bad_clock():
    world = World(make_plan({"a": []}))
    with pytest.raises(InvalidInput, match="now_ms"):
        decide_frontier(world.agg, 1.5)
