"""The run path, on both stores: a step costs two commits (`lease_attempts(start=True)`
and `complete`), and the completion writes exactly the records the frontier and
attempt admission phases would have written (docs/DESIGN.md "The run path")."""

from __future__ import annotations

import uuid

import psycopg
import pytest

import qlflow
from actors.workers import _decide_and_commit
from domain import worker as worker_rules
from eventstore import faults
from eventstore.url import with_search_path
from qlflow.errors import FenceError, InvalidInput
from tests.cycle.helpers import DIAMOND, T0, manifest

RUN_ID = "run-path-1"
FAN = [("a", []), *((k, ["a"]) for k in "bcdefg"), ("h", list("bcdefg"))]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def two_urls(request, tmp_path):
    """Two fresh stores of one dialect (the same ids in both)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
        return
    server = request.getfixturevalue("pg_server_url")
    schemas = [f"t_{uuid.uuid4().hex}" for _ in range(2)]
    with psycopg.connect(server, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield tuple(with_search_path(server, s) for s in schemas)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


def _start(rt, steps, now_ms=T0):
    rt.publish(manifest(steps), now_ms=now_ms)
    return rt.start("demo", "flow", admission_key="k", run_id=RUN_ID, now_ms=now_ms).run_id


def _complete_alone(rt, lease, outcome, now_ms):
    """The completion without its consequences: what `complete` wrote before."""
    rt._authority.execute(
        lambda tx: _decide_and_commit(
            tx,
            lease.run_id,
            lambda agg: worker_rules.complete(
                agg, lease.attempt_id, lease.lease_id, lease.version, outcome, None, None, now_ms
            ),
            attempt_id=lease.attempt_id,
        ),
        name="complete",
    )


def _log(rt, run_id):
    return [
        (r.stream_id, r.stream_version, r.event_id, r.type, dict(r.data), dict(r.metadata))
        for r in sorted(rt.events(run_id), key=lambda r: (r.stream_id, r.stream_version))
    ]


@pytest.mark.parametrize("failing", [None, "b"])
def test_completion_writes_what_the_phases_would(two_urls, failing):
    """Store A: `complete` carries its consequences. Store B: the bare completion, then
    a cycle at the same instant. The same records (ids, types, data); on the success
    path at the same versions with the same metadata, but the actor."""
    logs, actors = [], []
    for url, carried in zip(two_urls, (True, False), strict=True):
        rt = qlflow.open(url)
        try:
            run_id = _start(rt, FAN)
            now = T0
            while rt.get_run(run_id).status == "running":
                rt.cycle(now_ms=now)
                for lease in rt.lease_attempts("w1", limit=16, now_ms=now, start=True):
                    outcome = "failed" if lease.step_key == failing else "succeeded"
                    if carried:
                        rt.complete(lease, outcome, now_ms=now)
                    else:
                        _complete_alone(rt, lease, outcome, now)
                        rt.cycle(now_ms=now)
                now += 10
                assert now < T0 + 1_000
            log = _log(rt, run_id)
            if failing is None:
                logs.append([(*entry[:5], {**entry[5], "actor": None}) for entry in log])
            else:
                # the cycle's frontier candidates may see a skip later than the completion
                # decides it: the same records, at a later version, caused by a later head
                logs.append(
                    sorted(
                        (
                            stream,
                            event_id,
                            kind,
                            sorted((k, repr(v)) for k, v in data.items() if k != "run_version"),
                        )
                        for stream, _, event_id, kind, data, _ in log
                    )
                )
            actors.append({entry[5]["actor"] for entry in log})
            assert rt.verify_projections().ok
        finally:
            rt.close()
    assert logs[0] == logs[1]
    # roots are ready at admission and claimed by the cycle; the rest the workers wrote
    assert actors[0] == {"admission", "cycle:attempts", "worker:w1"}
    assert actors[1] == {"admission", "cycle:attempts", "cycle:frontier", "worker:w1"}


def test_a_step_costs_at_most_two_commits(rt):
    run_id = _start(rt, FAN)
    units: dict[str, int] = {}

    def count(name: str) -> None:
        if name.endswith(".after_commit"):
            unit = name.removesuffix(".after_commit")
            units[unit] = units.get(unit, 0) + 1

    faults.watch(count)
    try:
        now = T0
        while rt.get_run(run_id).status == "running":
            rt.cycle(now_ms=now)
            for lease in rt.lease_attempts("w1", limit=16, now_ms=now, start=True):
                assert lease.started
                rt.complete(lease, "succeeded", now_ms=now)
            now += 10
    finally:
        faults.disarm()
    assert rt.get_run(run_id).status == "succeeded"
    steps = len(FAN)
    # the root's claim is the cycle's (unit "admission"); every other commit a worker's:
    # one lease per wave of the DAG (a, then b..g together, then h), one per completion
    assert units == {"lease_start": 3, "complete": steps, "admission": 1}


def test_lease_with_start_is_the_start_barrier(rt):
    run_id = _start(rt, DIAMOND)
    rt.cycle(now_ms=T0)
    (lease,) = rt.lease_attempts("w1", limit=4, now_ms=T0, start=True)
    step = rt.get_run(run_id).steps["a"]
    assert step.status == "running"
    assert [a.status for a in step.attempts] == ["starting"]
    types = [r.type for r in rt.events(run_id, types=["lease.granted", "attempt.starting"])]
    assert types == ["lease.granted", "attempt.starting"]
    assert rt.mark_running(lease, now_ms=T0 + 1) == lease  # still available, optional
    rt.complete(lease, "succeeded", now_ms=T0 + 2)
    # the dependents were claimed by the completion: leasable with no cycle between
    leased = rt.lease_attempts("w1", limit=4, now_ms=T0 + 3, start=True)
    assert sorted(lease.step_key for lease in leased) == ["b", "c"]


def test_start_lease_is_refused_under_cancel_intent_and_typed(rt):
    run_id = _start(rt, DIAMOND)
    rt.cycle(now_ms=T0)
    with pytest.raises(InvalidInput):
        rt.lease_attempts("w1", now_ms=T0, start=1)
    rt.cancel(run_id, now_ms=T0 + 1)
    assert rt.lease_attempts("w1", now_ms=T0 + 2, start=True) == []


def test_completion_under_cancel_intent_leaves_the_rest_to_the_cycle(rt):
    run_id = _start(rt, DIAMOND)
    rt.cycle(now_ms=T0)
    (lease,) = rt.lease_attempts("w1", now_ms=T0, start=True)
    rt.cancel(run_id, now_ms=T0 + 1)
    assert rt.complete(lease, "succeeded", now_ms=T0 + 2) == "cancelled"
    assert rt.get_run(run_id).steps["b"].status == "pending"  # the completion left it
    rt.cycle(now_ms=T0 + 3)
    assert rt.get_run(run_id).status == "cancelled"
    with pytest.raises(FenceError):
        rt.complete(lease, "failed", now_ms=T0 + 4)
