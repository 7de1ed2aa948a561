"""The fold: admission worked example, aggregate contents, and every integrity rule
raising CorruptionError that names the offending record."""

from __future__ import annotations

import dataclasses
import re

import pytest

from domain.admission import admission_records
from domain.aggregate import effective_intent, fold
from domain.cancellation import decide_cancellation, request_cancel
from domain.errors import CorruptionError, InvalidInput
from domain.streams import lease_stream, run_stream, steps_stream
from domain.worker import renew
from tests.domain.strategies import (
    RUN_ID,
    START_MS,
    TTL_MS,
    World,
    attempt_of,
    chain_needs,
    claim,
    finish,
    lease,
    make_plan,
    start,
)

RUN = run_stream(RUN_ID)
STEPS = steps_stream(RUN_ID)


def two_step_world() -> World:
    return World(make_plan({"a": [], "b": ["a"]}))


def streams(world: World):
    leases = {a: world.records(lease_stream(a)) for a in world.agg.attempts}
    return world.records(RUN), world.records(STEPS), leases


def with_data(record, **changes):
    return dataclasses.replace(record, data={**record.data, **changes})


def expect_corruption(match: str, run, steps, leases=None):
    with pytest.raises(CorruptionError, match=match) as caught:
        fold(run, steps, leases or {})
    return str(caught.value)


# --- admission and folding ------------------------------------------------------------


def test_admission_worked_example_two_steps():
    plan = make_plan({"a": [], "b": ["a"]})
    decision = admission_records(plan, "key-1", START_MS)
    run_events = decision.events(RUN)
    mutations = decision.events(STEPS)
    assert [e.type for e in run_events] == ["workflow.admitted", "step.created", "step.created"]
    assert [e.data["status"] for e in run_events[1:]] == ["ready", "pending"]
    assert len(mutations) == 2
    assert [a.expected_version for a in decision.appends] == [0, 0]
    world = World(plan)
    assert world.agg.version == 3
    assert world.agg.steps_version == 2
    assert {k: (s.status, s.epoch) for k, s in world.agg.steps.items()} == {
        "a": ("ready", 1),
        "b": ("pending", 1),
    }
    assert world.agg.run.admitted_at_ms == START_MS
    assert world.agg.plan == plan


def test_admission_refuses_bad_input_without_records():
    plan = make_plan({"a": []})
    with pytest.raises(InvalidInput, match="admission_key"):
        admission_records(plan, "", START_MS)
    with pytest.raises(InvalidInput, match="now_ms"):
        admission_records(plan, "k", -1)
    with pytest.raises(InvalidInput, match="ExecutionPlan"):
        admission_records({"plan": 1}, "k", 1)


def test_admission_is_byte_identical_for_the_same_input():
    plan = make_plan(chain_needs(5))
    assert admission_records(plan, "k", 7) == admission_records(plan, "k", 7)
    other = admission_records(make_plan(chain_needs(5), run_id="run-2"), "k", 7)
    assert {e.event_id for e in other.events("run-run-2")}.isdisjoint(
        e.event_id for e in admission_records(plan, "k", 7).events(RUN)
    )


def test_fold_tracks_attempts_leases_and_deadline():
    world = World(make_plan({"a": []}, timeout_ms=60_000))
    claim(world)
    grant = start(world, "a", running=True)
    agg = world.agg
    attempt = attempt_of(world, "a")
    assert attempt.status == "running"
    assert attempt.started_lease_id == grant.lease_id
    assert attempt.lease.version == grant.version == agg.lease_versions[attempt.attempt_id]
    assert attempt.admission["plan_digest"] == agg.plan.plan_digest
    assert agg.steps["a"].status == "running" and agg.steps["a"].epoch == 2
    assert agg.run.deadline_ms == START_MS + 60_000
    assert effective_intent(agg, START_MS + 59_999) is None
    assert effective_intent(agg, START_MS + 60_000) == ("timeout", START_MS + 60_000)


def test_recorded_intent_wins_over_a_later_deadline():
    world = World(make_plan({"a": []}, timeout_ms=60_000))
    world.apply(request_cancel(world.agg, "user", START_MS + 5))
    assert effective_intent(world.agg, START_MS + 10**6) == ("user", START_MS + 5)


def test_extend_equals_a_fold_from_scratch():
    world = World(make_plan(chain_needs(3)))
    claim(world)
    finish(world, "s000")
    claim(world)
    assert world.refold() == world.agg


# --- corruption: run stream -----------------------------------------------------------


def test_gap_in_run_versions_names_the_record():
    world = two_step_world()
    run, steps, _ = streams(world)
    moved = dataclasses.replace(run[2], stream_version=4)
    message = expect_corruption("version gap", [run[0], run[1], moved], steps)
    assert f"{RUN} v4 ({moved.event_id}, step.created)" in message


def test_run_stream_must_open_with_admitted():
    world = two_step_world()
    run, steps, _ = streams(world)
    first = dataclasses.replace(run[0], type="workflow.succeeded")
    expect_corruption("must open with workflow.admitted", [first, *run[1:]], steps)


def test_admitted_without_plan_is_corrupt():
    world = two_step_world()
    run, steps, _ = streams(world)
    data = {k: v for k, v in run[0].data.items() if k != "plan"}
    first = dataclasses.replace(run[0], data=data)
    expect_corruption("carries no plan", [first, *run[1:]], steps)


def test_empty_run_stream_is_corrupt():
    with pytest.raises(CorruptionError, match="empty"):
        fold([], [], {})


def test_missing_step_created_is_corrupt():
    world = two_step_world()
    run, steps, _ = streams(world)
    expect_corruption(r"\['b'\] of the plan were never created", run[:2], steps[:1])


def test_illegal_step_transition_names_the_record():
    world = two_step_world()
    claim(world)
    start(world, "a")
    run, _steps, _leases = streams(world)
    # rewrite the start barrier's step.running as pending->running on b's neighbour a
    index = next(i for i, r in enumerate(run) if r.type == "step.running")
    bad = with_data(run[index], **{"from": "ready", "to": "succeeded"})
    bad = dataclasses.replace(bad, type="step.succeeded")
    message = expect_corruption("ready -> succeeded is not allowed", [*run[:index], bad], [])
    assert f"v{bad.stream_version} ({bad.event_id}, step.succeeded)" in message


def test_step_from_status_must_match():
    world = two_step_world()
    claim(world)
    finish(world, "a")
    claim(world)
    run, steps, _ = streams(world)
    index = next(i for i, r in enumerate(run) if r.type == "step.ready")
    bad = with_data(run[index], **{"from": "ready"})
    expect_corruption("was 'ready', but it is 'pending'", [*run[:index], bad], steps)


def test_step_epoch_must_grow_by_one():
    world = two_step_world()
    claim(world)
    finish(world, "a")
    run, steps, _ = streams(world)
    index = next(i for i, r in enumerate(run) if r.type == "step.succeeded")
    bad = with_data(run[index], epoch=7)
    expect_corruption("epoch 7, expected 3", [*run[:index], bad], steps)


def test_non_success_terminal_needs_a_result_code():
    world = two_step_world()
    claim(world)
    finish(world, "a", outcome="failed")
    run, steps, _ = streams(world)
    index = next(i for i, r in enumerate(run) if r.type == "step.failed")
    bad = with_data(run[index], result_code=None)
    expect_corruption("must carry a result code", [*run[:index], bad], steps)


def test_illegal_attempt_transition_is_corrupt():
    world = two_step_world()
    claim(world)
    finish(world, "a")
    run, steps, _ = streams(world)
    index = next(i for i, r in enumerate(run) if r.type == "attempt.starting")
    # skip the start barrier: claimed -> running is not a transition
    bad = dataclasses.replace(run[index], type="attempt.running")
    message = expect_corruption("claimed -> running is not allowed", [*run[:index], bad], steps)
    assert f"v{bad.stream_version} ({bad.event_id}, attempt.running)" in message


def test_event_after_terminal_is_corrupt():
    world = World(make_plan({"a": []}))
    claim(world)
    world.apply(request_cancel(world.agg, "user", world.now_ms))
    world.apply(decide_cancellation(world.agg, world.now_ms))
    assert world.agg.run.status == "cancelled"
    run, steps, _leases = streams(world)
    extra = dataclasses.replace(run[-2], stream_version=len(run) + 1, event_id="wfe:" + "0" * 32)
    expect_corruption("follows the Run's terminal status 'cancelled'", [*run, extra], steps)


def test_unknown_event_type_is_corrupt():
    world = two_step_world()
    run, steps, _ = streams(world)
    extra = dataclasses.replace(run[-1], stream_version=4, type="step", event_id="x" * 36)
    expect_corruption("not a RunEvent type", [*run, extra], steps)


def test_record_in_another_stream_is_corrupt():
    world = two_step_world()
    run, steps, _ = streams(world)
    moved = dataclasses.replace(run[1], stream_id="run-other")
    expect_corruption("is not in stream run-run-1", [run[0], moved, run[2]], steps)


# --- corruption: StepRunMutations -----------------------------------------------------


def test_mutation_pointing_at_a_missing_event_names_the_mutation():
    world = two_step_world()
    run, steps, _ = streams(world)
    bad = with_data(steps[1], event_id="wfe:" + "f" * 32, run_version=9)
    message = expect_corruption("points at 'wfe:f+' at run version 9", run, [steps[0], bad])
    assert f"{STEPS} v2 ({bad.event_id}, step_run.mutated)" in message


def test_mutation_describing_another_change_is_corrupt():
    world = two_step_world()
    run, steps, _ = streams(world)
    bad = with_data(steps[0], to="pending")
    expect_corruption("describes", run, [bad, steps[1]])


def test_step_event_without_mutation_is_corrupt():
    world = two_step_world()
    claim(world)
    finish(world, "a")
    claim(world)
    run, steps, _ = streams(world)
    message = expect_corruption("has no StepRunMutation", run, steps[:-1])
    assert "step.ready" in message


def test_extra_mutation_is_corrupt():
    world = two_step_world()
    run, steps, _ = streams(world)
    extra = dataclasses.replace(steps[1], stream_version=3)
    expect_corruption("not a step.\\* event without a mutation", run, [*steps, extra])


def test_gap_in_mutation_versions_is_corrupt():
    world = two_step_world()
    run, steps, _ = streams(world)
    expect_corruption("version gap: expected v1", run, steps[1:])


# --- corruption: lease streams --------------------------------------------------------


def test_gap_in_lease_versions_is_corrupt():
    world = World(make_plan({"a": []}))
    claim(world)
    grant = lease(world, "a")
    world.apply(
        renew(world.agg, grant.attempt_id, grant.lease_id, grant.version, TTL_MS, world.now_ms)
    )
    run, steps, leases = streams(world)
    records = leases[grant.attempt_id]
    message = expect_corruption(
        "version gap: expected v1", run, steps, {grant.attempt_id: records[1:]}
    )
    assert lease_stream(grant.attempt_id) in message


def test_lease_change_of_a_lease_not_held_is_corrupt():
    world = World(make_plan({"a": []}))
    claim(world)
    grant = lease(world, "a")
    run, steps, leases = streams(world)
    records = leases[grant.attempt_id]
    twice = dataclasses.replace(records[0], stream_version=2)
    expect_corruption("grants while lease", run, steps, {grant.attempt_id: [records[0], twice]})
    renamed = dataclasses.replace(
        records[0],
        stream_version=2,
        type="lease.renewed",
        data={**records[0].data, "lease_id": "x"},
    )
    expect_corruption("names lease 'x'", run, steps, {grant.attempt_id: [records[0], renamed]})


def test_lease_of_unknown_attempt_is_corrupt():
    world = World(make_plan({"a": []}))
    claim(world)
    grant = lease(world, "a")
    run, steps, leases = streams(world)
    expect_corruption(
        "lease of unknown Attempt", run, steps, {"wta:nope": leases[grant.attempt_id]}
    )


def test_corruption_messages_name_stream_version_and_event_id():
    world = two_step_world()
    run, steps, _ = streams(world)
    moved = dataclasses.replace(run[1], stream_version=5)
    message = expect_corruption("gap", [run[0], moved], steps)
    assert re.search(rf"{RUN} v5 \(wfe:[0-9a-f]{{32}}, step.created\)", message)
