"""The candidate index against the decisions, through the public API on both stores.

Random DAGs (1–128 Steps, most small) are driven by `cycle()` and by workers that
complete, fail, abandon a claim or a started Attempt (its lease then expires), with
random cancels and Run timeouts. Before every cycle, for the Run's aggregate
(`aggregate_at`) and each phase X:

- **safety of the index**: when `decide_X(aggregate, now)` returns records, the Run
  is among phase X's candidates at `now`;
- **no busy candidates**: a Run that is a candidate of X while `decide_X` is empty
  is not so again at the next cycle (no Run is rescanned forever);
- **liveness**: the Run is terminal within 4 × steps + 8 cycles.

Examples: 300 per store (the CI budget), scaled by `QLFLOW_FUZZ_EXAMPLES`
(tests/hypothesis_budget.py).
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qlflow
from domain.work import DECISIONS
from projections import candidates
from tests.cycle.helpers import DIAMOND, T0, manifest, statuses
from tests.hypothesis_budget import examples

EXAMPLES = examples(300)
TTL_MS = 5_000
_packages = itertools.count()


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


def start(rt, steps, *, timeout_ms=None, now_ms=T0, package="demo"):
    rt.publish(manifest(steps, timeout_ms=timeout_ms, package=package), now_ms=now_ms)
    return rt.start(package, "flow", admission_key=f"key-{package}", now_ms=now_ms).run_id


def test_a_join_is_skipped_as_soon_as_one_need_failed_while_a_sibling_runs(rt):
    """diamond a → (b, c) → d: b fails while c still runs; the next cycle skips d."""
    run_id = start(rt, DIAMOND)
    rt.cycle(now_ms=T0)
    (a,) = rt.lease_attempts("w1", limit=4, now_ms=T0)
    rt.mark_running(a, now_ms=T0)
    rt.complete(a, "succeeded", now_ms=T0)
    rt.cycle(now_ms=T0 + 10)
    leases = {lease.step_key: lease for lease in rt.lease_attempts("w1", limit=4, now_ms=T0 + 10)}
    assert sorted(leases) == ["b", "c"]
    rt.mark_running(leases["c"], now_ms=T0 + 10)
    rt.mark_running(leases["b"], now_ms=T0 + 10)
    rt.complete(leases["b"], "failed", now_ms=T0 + 20)
    rt.cycle(now_ms=T0 + 30)
    run = rt.get_run(run_id)
    assert statuses(rt, run_id) == {
        "a": "succeeded",
        "b": "failed",
        "c": "running",
        "d": "skipped",
    }
    assert run.steps["d"].result_code == "dependency_not_succeeded"
    assert run.status == "running"  # c still runs
    rt.complete(leases["c"], "succeeded", now_ms=T0 + 40)
    rt.cycle(now_ms=T0 + 50)
    assert rt.get_run(run_id).status == "failed"


@st.composite
def dags(draw) -> list[tuple[str, list[str]]]:
    """Most DAGs small (each worker write is a durable commit), a few up to 128 Steps."""
    size = draw(st.integers(0, 39))
    n = draw(
        st.integers(1, 6)
        if size < 34
        else st.integers(7, 24)
        if size < 39
        else st.integers(25, 128)
    )
    steps = []
    for i in range(n):
        picks = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        steps.append((f"s{i:03d}", sorted(f"s{j:03d}" for j in picks)))
    return steps


def candidates_at(rt, now_ms: int) -> dict[str, set[str]]:
    return {phase: set(candidates.page(rt.store, phase, now_ms, 10_000)) for phase in DECISIONS}


def check_index(rt, run_id: str, now_ms: int, idle: set[str]) -> set[str]:
    """Safety, and no busy candidates; returns the phases the Run idles in now."""
    aggregate = rt.aggregate_at(run_id)
    found = candidates_at(rt, now_ms)
    idle_now = set()
    for phase, decide in DECISIONS.items():
        has_work = bool(decide(aggregate, now_ms).appends)
        listed = run_id in found[phase]
        assert listed or not has_work, f"safety: {phase} has work at {now_ms} but no candidate"
        if listed and not has_work:
            assert phase not in idle, f"busy: a {phase} candidate with no work two cycles running"
            idle_now.add(phase)
    return idle_now


def work(rt, now_ms: int, rng: random.Random, misbehaved: set[str]) -> bool:
    """One round of workers; True when one abandoned a lease (let it expire)."""
    abandoned = False
    for lease in rt.lease_attempts("w1", limit=256, ttl_ms=TTL_MS, now_ms=now_ms):
        roll = rng.random()
        if lease.step_key not in misbehaved and roll < 0.15:
            misbehaved.add(lease.step_key)
            abandoned = True
            if roll < 0.07:
                rt.mark_starting(lease, now_ms=now_ms)  # then vanish past the barrier
            continue  # or vanish before starting
        rt.mark_running(lease, now_ms=now_ms)
        rt.complete(lease, "failed" if roll > 0.93 else "succeeded", now_ms=now_ms)
    return abandoned


@pytest.mark.timeout(900)  # 300 stateful Runs a store: 213 s on PostgreSQL on a loaded host
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    steps=dags(),
    timeout_ms=st.sampled_from((None, None, None, 3 * TTL_MS, 60_000)),
    seed=st.integers(0, 2**32),
)
def test_the_index_is_safe_never_busy_and_every_run_ends(rt, steps, timeout_ms, seed):
    rng = random.Random(seed)
    now = T0
    run_id = start(rt, steps, timeout_ms=timeout_ms, now_ms=now, package=f"p{next(_packages)}")
    bound = 4 * len(steps) + 8
    misbehaved: set[str] = set()
    idle: set[str] = set()
    cancelled = False
    for _cycle in range(bound):
        idle = check_index(rt, run_id, now, idle)
        rt.cycle(now_ms=now)
        if rt.get_run(run_id).status != "running":
            break
        if not cancelled and rng.random() < 0.03:
            cancelled = rt.cancel(run_id, now_ms=now)
        abandoned = work(rt, now, rng, misbehaved)
        now += TTL_MS if abandoned else rng.choice((1, 10, 1_000))
    else:
        pytest.fail(f"liveness: the Run is not terminal after {bound} cycles")
    check_index(rt, run_id, now, idle)
