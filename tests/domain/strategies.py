"""Helpers and hypothesis strategies for the pure core's decision tests.

- `make_plan(needs)` builds an ExecutionPlan directly (a stable fake digest).
- `World` keeps a Run's streams in memory and applies Decisions the way the
  store does: every append must meet its expected version, every event id is
  new, payloads go through JSON; the aggregate is extended after each append.
- `dag_needs()` draws random DAGs of 1–128 Steps; `reachable_worlds()` draws a
  Run driven through random legal decisions and worker actions with an
  increasing clock; `drive()` runs a whole random workload to the end.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence

import orjson
from hypothesis import strategies as st

from domain.admission import admission_records
from domain.aggregate import AttemptState, RunAggregate, extend, fold
from domain.attempts import decide_attempt_claims
from domain.cancellation import decide_cancellation, request_cancel
from domain.decision import Decision, DecisionBuilder, LeaseGrant
from domain.errors import FenceError, InvalidInput
from domain.frontier import decide_frontier
from domain.ids import FRONTIER_EVENT, FRONTIER_MUTATION, STEP_RUN_ID, derive_id
from domain.plan import PLAN_SCHEMA, ExecutionPlan, PlanStep
from domain.plan_v2 import PLAN_SCHEMA_V2
from domain.records import Record
from domain.recovery import decide_recovery
from domain.streams import lease_stream, run_stream, steps_stream
from domain.transitions import CANCEL_REASONS, RELEASE_REASONS
from domain.worker import complete, grant_lease, mark_running, mark_starting, release, renew

RUN_ID = "run-1"
START_MS = 1_000_000
TTL_MS = 5_000


def _digest(*parts: object) -> str:
    return "sha256:" + hashlib.sha256(repr(parts).encode()).hexdigest()


def make_plan(
    needs: Mapping[str, Sequence[str]],
    run_id: str = RUN_ID,
    timeout_ms: int | None = None,
    retries: Mapping[str, tuple[int, int]] | None = None,
    params: Mapping[str, object] | None = None,
    step_timeouts: Mapping[str, int] | None = None,
) -> ExecutionPlan:
    """A plan whose Steps are `needs`' keys, each needing the listed keys; `retries`
    gives some Steps (max_attempts, backoff_ms) and `params` are bound parameter
    values: either makes it a v2 plan. `step_timeouts` gives some Steps a timeout."""
    retries = dict(retries or {})
    step_timeouts = dict(step_timeouts or {})
    bound = tuple(sorted((params or {}).items()))
    steps = tuple(
        PlanStep(
            key=key,
            step_run_id=derive_id(STEP_RUN_ID, run_id, key),
            task_id=f"t-{key}",
            task_ref=f"pkg@1#t-{key}",
            source_digest=_digest("source", key),
            needs=tuple(sorted(needs[key])),
            initial_status="pending" if needs[key] else "ready",
            max_attempts=retries.get(key, (1, 0))[0],
            backoff_ms=retries.get(key, (1, 0))[1],
            timeout_ms=step_timeouts.get(key),
        )
        for key in sorted(needs)
    )
    v2 = bool(bound) or any(limit > 1 for limit, _ in retries.values())
    return ExecutionPlan(
        schema=PLAN_SCHEMA_V2 if v2 else PLAN_SCHEMA,
        project="proj",
        package="pkg",
        installation="inst",
        lock_digest=_digest("lock"),
        generation=1,
        revision_id="rev-1",
        revision_digest=_digest("revision"),
        publication_id="pub-1",
        publication_digest=_digest("publication"),
        workflow_key="wf",
        workflow_digest=_digest("workflow"),
        run_id=run_id,
        timeout_ms=timeout_ms,
        steps=steps,
        params=bound,
        plan_digest=_digest(
            "plan",
            run_id,
            timeout_ms,
            tuple(sorted(needs.items())),
            tuple(sorted(retries.items())),
            bound,
            *sorted(step_timeouts.items()),
        ),
    )


def chain_needs(n: int) -> dict[str, list[str]]:
    """s000 → s001 → … (each Step needs the one before)."""
    return {f"s{i:03d}": [f"s{i - 1:03d}"] if i else [] for i in range(n)}


def wide_needs(n: int) -> dict[str, list[str]]:
    """One root and n - 1 Steps that all need it."""
    return {f"s{i:03d}": ["s000"] if i else [] for i in range(n)}


class World:
    """One Run's streams in memory, appended to as the store would."""

    def __init__(
        self, plan: ExecutionPlan, now_ms: int = START_MS, admission_key: str = "key-1"
    ) -> None:
        self.plan = plan
        self.now_ms = now_ms
        self.streams: dict[str, list[Record]] = defaultdict(list)
        self.event_ids: set[str] = set()
        self.position = 0
        self.history: list[tuple[Decision, RunAggregate]] = []  # each decision, state after
        self.aggregate: RunAggregate | None = None
        self.apply(admission_records(plan, admission_key, now_ms))

    @property
    def agg(self) -> RunAggregate:
        assert self.aggregate is not None
        return self.aggregate

    def records(self, stream_id: str) -> list[Record]:
        return list(self.streams.get(stream_id, ()))

    def apply(self, decision: Decision) -> Decision:
        """Append the decision's records (checking CAS and id uniqueness) and fold them."""
        new: dict[str, list[Record]] = {}
        for append in decision.appends:
            stream = self.streams[append.stream_id]
            assert len(stream) == append.expected_version, (
                f"{append.stream_id}: at v{len(stream)}, decision expected "
                f"v{append.expected_version}"
            )
            added = []
            for offset, event in enumerate(append.events, start=1):
                assert event.event_id not in self.event_ids, f"duplicate id {event.event_id}"
                assert len(event.event_id) == 36
                self.event_ids.add(event.event_id)
                self.position += 1
                added.append(
                    Record(
                        event_id=event.event_id,
                        stream_id=append.stream_id,
                        stream_version=append.expected_version + offset,
                        global_position=self.position,
                        type=event.type,
                        data=orjson.loads(orjson.dumps(event.data, option=orjson.OPT_SORT_KEYS)),
                        metadata=orjson.loads(orjson.dumps(event.metadata)),
                    )
                )
            stream.extend(added)
            new[append.stream_id] = added
        run_id = self.plan.run_id
        run_new = new.pop(run_stream(run_id), [])
        steps_new = new.pop(steps_stream(run_id), [])
        leases_new = {
            stream_id.removeprefix("lease-"): records for stream_id, records in new.items()
        }
        if self.aggregate is None:
            self.aggregate = fold(run_new, steps_new, leases_new)
        else:
            self.aggregate = extend(self.aggregate, run_new, steps_new, leases_new)
        self.history.append((decision, self.aggregate))
        return decision

    def refold(self) -> RunAggregate:
        """Fold every stream from scratch."""
        run_id = self.plan.run_id
        leases = {
            attempt_id: self.records(lease_stream(attempt_id)) for attempt_id in self.agg.attempts
        }
        return fold(self.records(run_stream(run_id)), self.records(steps_stream(run_id)), leases)

    def tick(self, ms: int) -> None:
        self.now_ms += ms


# --- actions: each applies one decision (or nothing when it is refused) ---------------

CYCLE = {
    "recovery": decide_recovery,
    "cancellation": decide_cancellation,
    "frontier": decide_frontier,
    "attempts": decide_attempt_claims,
}
WORKER_ACTIONS = ("grant", "start", "running", "renew", "complete", "release")
ACTIONS = (*CYCLE, "cancel", *WORKER_ACTIONS, "tick")


def act(world: World, action: str, rng: random.Random) -> Decision | None:
    """Do `action` on `world` (a random target chosen with `rng`); None if refused."""
    agg = world.agg
    now = world.now_ms
    if action in CYCLE:
        return world.apply(CYCLE[action](agg, now))
    if action == "cancel":
        return world.apply(request_cancel(agg, rng.choice(CANCEL_REASONS), now))
    if action == "tick":
        world.tick(rng.choice((0, 1, 500, 2_000, TTL_MS, 3 * TTL_MS)))
        return None
    attempts = [a for a in agg.attempts.values() if a.is_active]
    if not attempts:
        return None
    attempt = rng.choice(attempts)
    lease = attempt.lease
    try:
        if action == "grant":
            decision = grant_lease(agg, attempt.attempt_id, f"w{rng.randrange(3)}", TTL_MS, now)
        elif lease is None:
            return None
        elif action == "start":
            decision = mark_starting(agg, attempt.attempt_id, lease.lease_id, lease.version, now)
        elif action == "running":
            decision = mark_running(agg, attempt.attempt_id, lease.lease_id, lease.version, now)
        elif action == "renew":
            decision = renew(agg, attempt.attempt_id, lease.lease_id, lease.version, TTL_MS, now)
        elif action == "complete":
            outcome = rng.choice(("succeeded", "failed"))
            decision = complete(
                agg,
                attempt.attempt_id,
                lease.lease_id,
                lease.version,
                outcome,
                None,
                {"exit": 0 if outcome == "succeeded" else 1},
                now,
            )
        else:
            reason = rng.choice(RELEASE_REASONS)
            decision = release(agg, attempt.attempt_id, lease.lease_id, lease.version, reason, now)
    except (FenceError, InvalidInput):
        return None
    return world.apply(decision)


@st.composite
def dag_needs(draw, min_steps: int = 1, max_steps: int = 128) -> dict[str, list[str]]:
    """A random DAG: Step keys are a random permutation of s000…, so key order and
    topological order differ; each Step needs up to 3 earlier Steps."""
    small = draw(st.booleans())
    n = draw(st.integers(min_steps, min(max_steps, 12) if small else max_steps))
    names = draw(st.permutations([f"s{i:03d}" for i in range(n)]))
    needs: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        picks = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        needs[name] = sorted(names[j] for j in picks)
    return needs


@st.composite
def plans(draw, min_steps: int = 1, max_steps: int = 128) -> ExecutionPlan:
    """A random plan with every feature a plan can have: a DAG, often a Workflow
    deadline, often retry policies on some Steps whose backoffs are shorter and
    longer than the deadline (and than a lease), often bound parameters."""
    needs = draw(dag_needs(min_steps, max_steps))
    timeout = draw(st.sampled_from(TIMEOUTS_MS))
    retries = draw(
        st.one_of(
            st.just({}),
            st.dictionaries(
                st.sampled_from(sorted(needs)),
                st.tuples(st.integers(2, 4), st.sampled_from(BACKOFFS_MS)),
                max_size=len(needs),
            ),
        )
    )
    params = draw(st.one_of(st.just({}), st.fixed_dictionaries({}, optional=PARAMS)))
    return make_plan(needs, timeout_ms=timeout, retries=retries, params=params)


PARAMS = {
    "date": st.sampled_from(("2026-12-01", "2026-03-29")),
    "limit": st.integers(0, 10**6),
    "dry": st.booleans(),
    "label": st.text(max_size=12),
}
"""Bound parameter values of each type a Workflow parameter can have
(`domain.params.PARAM_TYPES`)."""


TIMEOUTS_MS = (None, None, 4_000, 30_000, 120_000)
BACKOFFS_MS = (0, 1, 500, TTL_MS, 20_000, 60_000, 200_000)
"""Backoffs either side of each deadline in `TIMEOUTS_MS` and of a lease (`TTL_MS`)."""


@st.composite
def reachable_worlds(draw, max_steps: int = 40, max_actions: int = 120) -> World:
    """A Run driven by random legal decisions and worker actions, clock increasing.

    The action mix favours progress (cycle phases, a worker's next step) so that
    deep states — running, lost, partially cancelled — are common.
    """
    world = World(draw(plans(1, max_steps)))
    rng = random.Random(draw(st.integers(0, 2**32)))  # a seed: an even spread of actions
    for _ in range(draw(st.integers(0, max_actions))):
        action = rng.choices(WEIGHTED_ACTIONS, weights=ACTION_WEIGHTS)[0]
        if action == "progress":
            attempts = world.agg.active_attempts()
            if attempts:
                attempt = rng.choice(attempts)
                act_on(world, attempt.attempt_id, next_worker_step(world, attempt), rng)
        else:
            act(world, action, rng)
    return world


ACTION_WEIGHT = {
    "recovery": 3, "cancellation": 1, "frontier": 4, "attempts": 4, "cancel": 0.3,
    "grant": 1, "start": 1, "running": 1, "renew": 1, "complete": 1, "release": 0.5,
    "tick": 2, "progress": 12,
}  # fmt: skip
WEIGHTED_ACTIONS = tuple(ACTION_WEIGHT)
ACTION_WEIGHTS = tuple(ACTION_WEIGHT.values())


def next_worker_step(world: World, attempt: AttemptState) -> str:
    """What a well-behaved worker does next with `attempt`."""
    if attempt.status == "claimed":
        return "start" if attempt.has_live_lease(world.now_ms) else "grant"
    return "running" if attempt.status == "starting" else "complete"


def drive(world: World, rng: random.Random, max_rounds: int = 400) -> int:
    """Run a whole random workload: cycles, workers that succeed, fail, stall or
    release, random cancels and expiries. Returns the number of rounds used."""
    for rounds in range(1, max_rounds + 1):
        for decide in CYCLE.values():
            world.apply(decide(world.agg, world.now_ms))
        if world.agg.run.is_terminal:
            return rounds
        if rng.random() < 0.02:
            act(world, "cancel", rng)
        for attempt in [a for a in world.agg.attempts.values() if a.is_active]:
            behaviour = rng.random()
            if behaviour < 0.1:
                continue  # stalls: its lease (if any) will expire
            if behaviour < 0.2:
                act_on(world, attempt.attempt_id, "grant", rng)
                act_on(world, attempt.attempt_id, "release", rng)
                continue
            for action in ("grant", "start", "running", "complete"):
                if not world.agg.attempts[attempt.attempt_id].is_active:
                    break
                act_on(world, attempt.attempt_id, action, rng)
        world.tick(rng.choice((1_000, 2_000, TTL_MS)))
    raise AssertionError(f"workload did not finish in {max_rounds} rounds")


def act_on(world: World, attempt_id: str, action: str, rng: random.Random) -> Decision | None:
    """Like `act` but on a chosen Attempt."""
    agg = world.agg
    attempt = agg.attempts[attempt_id]
    lease = attempt.lease
    now = world.now_ms
    try:
        if action == "grant":
            if attempt.has_live_lease(now) or attempt.status != "claimed":
                return None
            decision = grant_lease(agg, attempt_id, "w1", TTL_MS, now)
        elif lease is None:
            return None
        elif action == "start":
            decision = mark_starting(agg, attempt_id, lease.lease_id, lease.version, now)
        elif action == "running":
            decision = mark_running(agg, attempt_id, lease.lease_id, lease.version, now)
        elif action == "complete":
            outcome = "succeeded" if rng.random() < 0.85 else "failed"
            decision = complete(
                agg, attempt_id, lease.lease_id, lease.version, outcome, None, None, now
            )
        else:
            decision = release(agg, attempt_id, lease.lease_id, lease.version, "declined", now)
    except (FenceError, InvalidInput):
        return None
    return world.apply(decision)


# --- scenario helpers for table tests ---------------------------------------------------


def attempt_of(world: World, key: str) -> AttemptState:
    """The latest Attempt of Step `key`."""
    return world.agg.attempts[world.agg.steps[key].attempt_ids[-1]]


def claim(world: World) -> Decision:
    """Advance the frontier and admit Attempts for every ready Step."""
    world.apply(decide_frontier(world.agg, world.now_ms))
    return world.apply(decide_attempt_claims(world.agg, world.now_ms))


def lease(world: World, key: str, worker: str = "w1", ttl_ms: int = TTL_MS) -> LeaseGrant:
    """Lease the latest Attempt of `key`; returns the grant."""
    decision = world.apply(
        grant_lease(world.agg, attempt_of(world, key).attempt_id, worker, ttl_ms, world.now_ms)
    )
    assert decision.lease is not None
    return decision.lease


def start(world: World, key: str, running: bool = False) -> LeaseGrant:
    """Lease and start the latest Attempt of `key` (and mark it running if asked)."""
    grant = lease(world, key)
    step = mark_running if running else mark_starting
    world.apply(step(world.agg, grant.attempt_id, grant.lease_id, grant.version, world.now_ms))
    return grant


def finish(world: World, key: str, outcome: str = "succeeded") -> Decision:
    """Run the latest Attempt of `key` to completion with `outcome`."""
    grant = start(world, key, running=True)
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


def force_step(world: World, key: str, to_status: str, result_code: str | None = None) -> None:
    """Write a StepRun change no v1 decision makes (waiting_approval, a bare requeue)."""
    builder = DecisionBuilder.on(world.agg, world.now_ms, "test")
    _, epoch = builder.step(key)
    parts = ("test", key, epoch, to_status)
    builder.change_step(
        key, to_status, (FRONTIER_EVENT, FRONTIER_MUTATION, parts), result_code=result_code
    )
    world.apply(builder.build())


# --- worlds of the defects found so far: `@example` cases, checked on every run ---------


def retry_under_deadline_world() -> World:
    """A Step that may retry failed once under a Workflow deadline: attempt admission
    is closed until the retry time, open from it, and closed again at the deadline
    (the window once found by bisection came out empty and stranded the Run)."""
    world = World(make_plan({"a": []}, timeout_ms=30_000, retries={"a": (3, 2_000)}))
    claim(world)
    finish(world, "a", "failed")
    return world


def diamond_failure_world() -> World:
    """a → b, c → d: b failed while c still runs. d is skipped at once; the skip
    never waits for the running sibling."""
    world = World(make_plan({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}))
    claim(world)
    finish(world, "a")
    claim(world)
    start(world, "c", running=True)
    finish(world, "b", "failed")
    return world
