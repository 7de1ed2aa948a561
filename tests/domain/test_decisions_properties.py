"""Properties of every decision over random DAGs (1–128 Steps) and random reachable
states: determinism to the byte, idempotence, contiguous versions, parent last,
blocked work never ended, bounded settlement, whole-DAG skips, and random
workloads that always finish without running a Step twice."""

from __future__ import annotations

import random

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.aggregate import AttemptState, RunAggregate
from domain.attempts import decide_attempt_claims
from domain.cancellation import decide_cancellation, request_cancel
from domain.decision import Decision
from domain.errors import QlflowError
from domain.frontier import decide_frontier
from domain.recovery import decide_recovery
from domain.streams import run_stream
from domain.transitions import (
    ATTEMPT_INTERRUPTED,
    CANCEL_REASONS,
    MAX_INTERRUPTIONS,
    STEP_NOT_SUCCEEDED,
    STEP_TERMINAL,
)
from domain.worker import complete, grant_lease, mark_running, mark_starting, release, renew
from tests.domain.strategies import (
    TTL_MS,
    World,
    claim,
    dag_needs,
    drive,
    finish,
    make_plan,
    plans,
    reachable_worlds,
)
from tests.hypothesis_budget import examples

PROPERTY = settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DECIDERS = {
    "frontier": decide_frontier,
    "recovery": decide_recovery,
    "cancellation": decide_cancellation,
    "attempts": decide_attempt_claims,
}
later = st.sampled_from((0, 1, TTL_MS - 1, TTL_MS, 4 * TTL_MS, 10**6))


def encode(decision: Decision) -> bytes:
    """Every byte a decision would hand the store (and what it reports)."""
    return orjson.dumps(
        {
            "appends": [
                [
                    a.stream_id,
                    a.expected_version,
                    [[e.event_id, e.type, e.data, e.metadata] for e in a.events],
                ]
                for a in decision.appends
            ],
            "blocked": decision.blocked,
            "counters": [decision.settled_attempts, decision.settled_steps, decision.run_terminal],
        },
        option=orjson.OPT_SORT_KEYS,
    )


def worker_writes(agg: RunAggregate, now: int):
    """Every worker write a well-behaved worker could try now, as callables."""
    for attempt in agg.active_attempts():
        aid = attempt.attempt_id
        yield lambda aid=aid: grant_lease(agg, aid, "w9", TTL_MS, now)
        lease = attempt.lease
        if lease is None:
            continue
        lid, v = lease.lease_id, lease.version
        yield lambda aid=aid, lid=lid, v=v: mark_starting(agg, aid, lid, v, now)
        yield lambda aid=aid, lid=lid, v=v: mark_running(agg, aid, lid, v, now)
        yield lambda aid=aid, lid=lid, v=v: renew(agg, aid, lid, v, TTL_MS, now)
        yield lambda aid=aid, lid=lid, v=v: complete(agg, aid, lid, v, "failed", "x", {"a": 1}, now)
        yield lambda aid=aid, lid=lid, v=v: release(agg, aid, lid, v, "declined", now)


def outcome(write) -> bytes | str:
    try:
        return encode(write())
    except QlflowError as error:
        return f"{type(error).__name__}: {error}"


def lost_attempts(decision: Decision) -> set[str]:
    return {
        e.data["attempt_id"] for a in decision.appends for e in a.events if e.type == "attempt.lost"
    }


def check_history(world: World) -> None:
    """The parent's terminal record is last and appears only when every StepRun is
    terminal (and, for cancellation, nothing is blocked)."""
    for decision, after in world.history:
        events = decision.events(run_stream(after.run_id))
        terminal_events = [
            e
            for e in events
            if e.type.startswith("workflow.")
            and e.type.split(".")[1] in ("succeeded", "failed", "cancelled", "timed_out")
        ]
        if decision.run_terminal is None:
            assert not terminal_events
            continue
        assert terminal_events == [events[-1]]
        assert events[-1].type == f"workflow.{decision.run_terminal}"
        assert all(s.status in STEP_TERMINAL for s in after.steps.values())
        assert decision.blocked == ()
        assert after.run.status == decision.run_terminal


@PROPERTY
@given(reachable_worlds(), later)
def test_same_input_gives_byte_identical_records(world, extra):
    agg = world.agg
    refolded = world.refold()
    assert refolded == agg
    now = world.now_ms + extra
    for decide in DECIDERS.values():
        first = decide(agg, now)
        assert encode(first) == encode(decide(agg, now)) == encode(decide(refolded, now))
        assert first == decide(refolded, now)
    assert encode(request_cancel(agg, "user", now)) == encode(request_cancel(refolded, "user", now))
    for write in worker_writes(agg, now):
        assert outcome(write) == outcome(write)


@PROPERTY
@given(reachable_worlds(), st.sampled_from(sorted(DECIDERS)), later)
def test_deciding_again_after_applying_yields_nothing_new(world, name, extra):
    world.tick(extra)
    decide = DECIDERS[name]
    decision = world.apply(decide(world.agg, world.now_ms))  # CAS and fresh ids checked here
    assert decide(world.agg, world.now_ms).appends == ()
    if name == "recovery":  # an Attempt is recovered once, however late it is looked at
        late = decide(world.agg, world.now_ms + 10**7)
        assert not lost_attempts(decision) & lost_attempts(late)
    assert world.refold() == world.agg  # versions contiguous, every mutation paired
    check_history(world)
    if decision.run_terminal is None and name != "cancellation":
        assert world.agg.run.status == "running" or decision.noop


@PROPERTY
@given(reachable_worlds(), later, st.sampled_from((None, *CANCEL_REASONS)))
def test_cancellation_never_ends_work_a_worker_holds(world, extra, reason):
    if reason is not None:
        world.apply(request_cancel(world.agg, reason, world.now_ms))
    world.tick(extra)
    now = world.now_ms
    before = world.agg
    holding = {
        a.attempt_id
        for a in before.active_attempts()
        if a.status != "claimed"
        or a.has_live_lease(now)
        or before.steps[a.step_key].epoch != a.step_epoch
        or before.steps[a.step_key].status != "ready"
    }
    running = {k for k, s in before.steps.items() if s.status == "running"}
    decision = world.apply(decide_cancellation(before, now))
    after = world.agg
    for attempt_id in holding:
        assert after.attempts[attempt_id] == before.attempts[attempt_id]
    for key in running:
        assert after.steps[key] == before.steps[key]
    ended = [a for a in before.active_attempts() if not after.attempts[a.attempt_id].is_active]
    assert decision.settled_attempts == len(ended) <= 128 * 1  # one Run scanned
    if before.run.status == "running" and (
        reason is not None or before.run.cancel_reason or (before.run.deadline_ms or 10**18) <= now
    ):
        expected_blocked = {*holding, *(before.steps[k].step_run_id for k in running)}
        expected_blocked |= {before.attempts[a].step_run_id for a in holding}
        assert set(decision.blocked) == expected_blocked
        if not decision.blocked:
            assert after.run.is_terminal
    check_history(world)
    assert decide_cancellation(after, now).appends == ()


@PROPERTY
@given(dag_needs(2, 128), st.data())
def test_a_failure_skips_every_descendant_in_one_decision(needs, data):
    world = World(make_plan(needs))
    roots = sorted(k for k, v in needs.items() if not v)
    failed = data.draw(st.sampled_from(roots))
    claim(world)
    finish(world, failed, outcome="failed")
    dependants: dict[str, list[str]] = {k: [] for k in needs}
    for key, key_needs in needs.items():
        for need in key_needs:
            dependants[need].append(key)
    descendants, stack = set(), [failed]
    while stack:
        for child in dependants[stack.pop()]:
            if child not in descendants:
                descendants.add(child)
                stack.append(child)
    decision = world.apply(decide_frontier(world.agg, world.now_ms))
    statuses = {k: s.status for k, s in world.agg.steps.items()}
    assert all(statuses[k] == "skipped" for k in descendants)
    assert decision.settled_steps == len(descendants)
    for key, step in world.agg.steps.items():
        if step.status == "pending":
            assert not any(statuses[n] in STEP_NOT_SUCCEEDED for n in step.needs), key
    check_history(world)


def assert_never_started_twice_behind_your_back(agg: RunAggregate, key: str) -> None:
    """A step crosses the start barrier again only after the host that ran it said how
    its start ended: a reported failure under the step's retry policy (at most
    `max_attempts` of them: failed, or stopped by its host at the step's timeout) or
    an interruption (at most MAX_INTERRUPTIONS); never after a lost Attempt, whose
    process may still be running."""
    step = agg.steps[key]
    started = [agg.attempts[a] for a in step.attempt_ids if agg.attempts[a].started_lease_id]

    def reported_failure(attempt: AttemptState) -> bool:
        return attempt.status == "failed" or (
            attempt.status == "timed_out" and attempt.result_code == "step_timeout"
        )

    for earlier in started[:-1]:
        assert reported_failure(earlier) or earlier.status == ATTEMPT_INTERRUPTED, (
            key,
            earlier.status,
        )
    failures = sum(1 for a in started if reported_failure(a))
    interruptions = sum(1 for a in started if a.status == ATTEMPT_INTERRUPTED)
    assert failures <= agg.plan.step(key).max_attempts, key
    assert interruptions <= MAX_INTERRUPTIONS + 1, key


@settings(PROPERTY, max_examples=examples(50))
@given(plans(1, 128), st.integers(0, 2**32))
def test_random_workloads_finish_and_never_start_a_step_twice(plan, seed):
    world = World(plan)
    drive(world, random.Random(seed))
    agg = world.agg
    assert agg.run.is_terminal
    assert all(s.status in STEP_TERMINAL for s in agg.steps.values())
    assert not agg.active_attempts()
    for step in agg.steps.values():
        assert_never_started_twice_behind_your_back(agg, step.key)
    assert world.refold() == agg
    check_history(world)
