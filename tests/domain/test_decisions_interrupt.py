"""Interruptions (docs/DESIGN.md, "Interruptions"): a step its host stopped goes back
to ready without using up an attempt, as an event of its own, at most three times;
the next one fails it (interrupted_too_often). Cancel intent still wins."""

from __future__ import annotations

import pytest

from domain.attempts import decide_attempt_claims
from domain.cancellation import request_cancel
from domain.errors import PlanError
from domain.retries import reported_failures
from domain.revision import revision_from_json, revision_to_json
from domain.streams import run_stream
from domain.tasks import define_task
from domain.transitions import INTERRUPTED_TOO_OFTEN, MAX_INTERRUPTIONS, WORKER_SHUTDOWN
from domain.worker import complete, interruptions
from tests.domain.strategies import RUN_ID, World, attempt_of, claim, finish, make_plan, start
from tests.domain.test_plan import task
from tests.domain.test_plan_package import DIAMOND, revision

RUN = run_stream(RUN_ID)


def _world() -> World:
    world = World(make_plan({"a": [], "b": ["a"]}))
    claim(world)
    return world


def _types(decision):
    return [e.type for e in decision.events(RUN)]


def test_an_interruption_requeues_the_step_without_using_an_attempt():
    world = _world()
    first = attempt_of(world, "a").attempt_id

    decision = finish(world, "a", "interrupted")

    assert _types(decision) == ["attempt.interrupted", "step.ready"]
    interrupted, ready = decision.events(RUN)
    assert interrupted.data["result_code"] == WORKER_SHUTDOWN
    assert interrupted.data["reported_outcome"] == "interrupted"
    assert ready.data["interrupted"] is True and "retry_at_ms" not in ready.data
    step = world.agg.steps["a"]
    assert (step.status, step.retry_at_ms) == ("ready", None)
    assert world.agg.attempts[first].status == "interrupted"
    assert reported_failures(world.agg, "a") == 0  # no attempt used up
    world.apply(decide_attempt_claims(world.agg, world.now_ms))  # runs again, a new Attempt
    assert attempt_of(world, "a").attempt_id != first
    assert attempt_of(world, "a").status == "claimed"
    assert world.refold() == world.agg  # the log folds to the same Run


def test_the_fourth_interruption_fails_the_step():
    world = _world()
    for done in range(MAX_INTERRUPTIONS):
        assert interruptions(world.agg, "a") == done
        finish(world, "a", "interrupted")
        world.apply(decide_attempt_claims(world.agg, world.now_ms))

    decision = finish(world, "a", "interrupted")

    assert _types(decision)[:2] == ["attempt.failed", "step.failed"]
    step = world.agg.steps["a"]
    assert (step.status, step.result_code) == ("failed", INTERRUPTED_TOO_OFTEN)
    assert world.agg.steps["b"].status == "pending"  # the frontier skips it next
    assert len(step.attempt_ids) == MAX_INTERRUPTIONS + 1


@pytest.mark.parametrize(("reason", "status"), [("user", "cancelled"), ("timeout", "timed_out")])
def test_under_cancel_intent_an_interruption_ends_like_any_outcome(reason, status):
    world = _world()
    grant = start(world, "a", running=True)
    world.apply(request_cancel(world.agg, reason, world.now_ms))
    decision = world.apply(
        complete(
            world.agg,
            grant.attempt_id,
            grant.lease_id,
            grant.version,
            "interrupted",
            None,
            None,
            world.now_ms,
        )
    )
    assert _types(decision) == [f"attempt.{status}", f"step.{status}"]


def test_a_replayed_interruption_writes_nothing():
    world = _world()
    grant = start(world, "a", running=True)
    args = (grant.attempt_id, grant.lease_id, grant.version, "interrupted", None, None)
    world.apply(complete(world.agg, *args, world.now_ms))
    again = complete(world.agg, *args, world.now_ms)
    assert again.replayed and not again.appends


def test_on_interrupt_changes_the_task_digests_only_where_declared():
    plain = define_task("fetch", ["true"])
    assert plain.definition() == {"command": ["true"], "env": {}, "files": []}
    assert define_task("fetch", ["true"], on_interrupt="requeue") == plain
    failing = define_task("fetch", ["true"], on_interrupt="fail")
    assert failing.source_digest != plain.source_digest
    digests = set()
    for one in (plain, failing):
        made = revision(tasks=[one, *(task(key) for key in DIAMOND if key != "fetch")])
        document = revision_to_json(made)
        assert ("on_interrupt" in document["tasks"]["fetch"]) is (one is failing)
        assert revision_from_json(document).tasks["fetch"].on_interrupt == one.on_interrupt
        digests.add(made.revision_digest)
    assert len(digests) == 2
    with pytest.raises(PlanError):
        define_task("fetch", ["true"], on_interrupt="retry")
