"""The run path, on both stores: a step costs two commits (`lease_attempts(start=True)`
and `complete`), and the completion writes exactly the records the frontier and
attempt admission phases would have written (docs/DESIGN.md "The run path")."""

from __future__ import annotations

import uuid

import psycopg
import pytest

import qlflow
from actors.run_writes import RunWrite, write_runs
from domain import worker as worker_rules
from eventstore import faults
from eventstore.url import with_search_path
from qlflow.errors import FenceError, InvalidInput, NotFound
from tests.commit_counter import commits_by_unit
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
        lambda tx: (
            write_runs(
                tx,
                [
                    RunWrite(
                        lease.run_id,
                        lambda agg: worker_rules.complete(
                            agg,
                            lease.attempt_id,
                            lease.lease_id,
                            lease.version,
                            outcome,
                            None,
                            None,
                            now_ms,
                        ),
                        lease.attempt_id,
                    )
                ],
                None,
                wait=True,
            )
            .written[0]
            .result()
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
    # roots are ready at admission and claimed by the start; the rest the workers wrote
    assert actors[0] == {"admission", "worker:w1"}
    assert actors[1] == {"admission", "cycle:attempts", "cycle:frontier", "worker:w1"}


def test_a_step_costs_at_most_two_commits(rt):
    run_id = _start(rt, FAN)
    with commits_by_unit() as units:
        now = T0
        while rt.get_run(run_id).status == "running":
            rt.cycle(now_ms=now)
            for lease in rt.lease_attempts("w1", limit=16, now_ms=now, start=True):
                assert lease.started
                rt.complete(lease, "succeeded", now_ms=now)
            now += 10
    assert rt.get_run(run_id).status == "succeeded"
    steps = len(FAN)
    # the root's claim is the start's (unit "admission"); every other commit a worker's:
    # one lease per wave of the DAG (a, then b..g together, then h), one per completion
    assert units == {"lease_start": 3, "complete": steps}


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


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_the_completion_of_the_last_held_attempt_ends_a_cancelled_run(two_urls, outcome):
    """Store A: the held Attempt's `complete` ends the Run it was the last hold of, no
    cycle between. Store B: the bare completion, then a cycle. The same records, at
    the same versions; only the actor differs."""
    logs = []
    for url, carried in zip(two_urls, (True, False), strict=True):
        rt = qlflow.open(url)
        try:
            run_id = _start(rt, DIAMOND)
            rt.cycle(now_ms=T0)
            (lease,) = rt.lease_attempts("w1", now_ms=T0, start=True)
            rt.cancel(run_id, now_ms=T0 + 1)
            assert rt.get_run(run_id).steps["b"].status == "cancelled"  # nobody held it
            assert rt.get_run(run_id).status == "running"  # the worker holds `a`
            if carried:
                assert rt.complete(lease, outcome, now_ms=T0 + 2) == "cancelled"
                assert rt.get_run(run_id).status == "cancelled"
                assert not rt.cycle(now_ms=T0 + 3).changed
            else:
                _complete_alone(rt, lease, outcome, T0 + 2)
                assert rt.get_run(run_id).status == "running"
                rt.cycle(now_ms=T0 + 2)
            assert rt.get_run(run_id).status == "cancelled"
            other = "failed" if outcome == "succeeded" else "succeeded"
            with pytest.raises(FenceError):  # the same outcome again is a replay
                rt.complete(lease, other, now_ms=T0 + 4)
            logs.append([(*entry[:5], {**entry[5], "actor": None}) for entry in _log(rt, run_id)])
            assert rt.verify_projections().ok
        finally:
            rt.close()
    assert logs[0] == logs[1]


def test_a_completion_past_the_deadline_times_the_run_out(rt):
    rt.publish(manifest(DIAMOND, timeout_ms=1_000), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", run_id=RUN_ID, now_ms=T0).run_id
    (lease,) = rt.lease_attempts("w1", now_ms=T0, start=True)
    assert rt.complete(lease, "succeeded", now_ms=T0 + 2_000) == "timed_out"
    assert rt.get_run(run_id).status == "timed_out"  # no cycle between


def test_start_claims_the_ready_roots_a_worker_leases_at_once(rt):
    run_id = _start(rt, [("a", []), ("b", []), ("c", ["a", "b"])])
    leased = rt.lease_attempts("w1", limit=4, now_ms=T0, start=True)
    assert sorted(lease.step_key for lease in leased) == ["a", "b"]  # no cycle between
    claims = rt.events(run_id, types=["attempt.claimed"])
    assert {r.metadata["actor"] for r in claims} == {"admission"}


def test_complete_many_records_several_runs_in_one_commit(rt):
    rt.publish(manifest(FAN), now_ms=T0)
    runs = [rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0).run_id for i in range(3)]
    leases = rt.lease_attempts("w1", limit=8, now_ms=T0, start=True)
    assert sorted(lease.run_id for lease in leases) == sorted(runs)
    with commits_by_unit() as units:
        done = rt.complete_many([qlflow.Completion(lease, "succeeded") for lease in leases], T0)
    assert units == {"complete": 1}
    assert [(d.lease, d.status, d.error) for d in done] == [(x, "succeeded", None) for x in leases]
    # each carried its consequences: b..g of every Run claimed, leasable now
    assert len(rt.lease_attempts("w1", limit=64, now_ms=T0 + 1)) == 3 * 6
    assert rt.verify_projections().ok


def test_complete_many_answers_a_fenced_completion_and_records_the_rest(rt):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    runs = [rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0).run_id for i in range(2)]
    first, second = sorted(rt.lease_attempts("w1", limit=2, now_ms=T0, start=True), key=str)
    assert rt.complete(first, "failed", now_ms=T0 + 1) == "failed"
    again = rt.complete_many(
        [
            qlflow.Completion(first, "succeeded"),  # its lease completed already: fenced
            qlflow.Completion(second, "succeeded", output={"n": 1}),
            qlflow.Completion(first, "failed"),  # the same report again: a replay
        ],
        now_ms=T0 + 2,
    )
    assert isinstance(again[0].error, FenceError) and again[0].status is None
    assert (again[1].status, again[1].error) == ("succeeded", None)
    assert (again[2].status, again[2].error) == ("failed", None)
    run = rt.get_run(second.run_id)
    assert run.steps["a"].attempts[0].output == {"n": 1}
    assert rt.get_run(first.run_id).status == "failed"
    assert sorted(runs) == sorted({first.run_id, second.run_id})


def test_complete_many_refuses_a_bad_argument_and_writes_nothing(rt):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    for i in range(2):
        rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0)
    leases = rt.lease_attempts("w1", limit=2, now_ms=T0, start=True)
    before = rt.store.head_position()
    with pytest.raises(InvalidInput, match=r"completions\[1\].*outcome"):
        rt.complete_many(
            [qlflow.Completion(leases[0], "succeeded"), qlflow.Completion(leases[1], "maybe")],
            now_ms=T0 + 1,
        )
    with pytest.raises(InvalidInput, match=r"qlflow\.Completion"):
        rt.complete_many([leases[0]], now_ms=T0 + 1)
    assert rt.store.head_position() == before
    assert rt.complete_many([], now_ms=T0 + 1) == []


def test_a_commit_that_does_not_answer_leaves_nothing_behind_in_memory(rt):
    """The Runs a runtime keeps in memory are only what COMMIT answered: a unit that
    failed before it (nothing written) or whose answer was lost (written) is read from
    the log next time."""
    run_id = _start(rt, DIAMOND)
    (lease,) = rt.lease_attempts("w1", now_ms=T0, start=True)
    faults.arm("complete.before_commit", "raise")
    try:
        with pytest.raises(Exception, match="injected fault"):
            rt.complete(lease, "succeeded", now_ms=T0 + 1)
    finally:
        faults.disarm()
    assert rt.get_run(run_id).steps["a"].status == "running"
    faults.arm("complete.after_commit", "raise")
    try:
        with pytest.raises(Exception, match="injected fault"):
            rt.complete(lease, "succeeded", now_ms=T0 + 2)
    finally:
        faults.disarm()
    assert rt.complete(lease, "succeeded", now_ms=T0 + 2) == "succeeded"  # a replay
    assert len(rt.events(run_id, types=["attempt.succeeded"])) == 1
    assert sorted(x.step_key for x in rt.lease_attempts("w1", limit=4, now_ms=T0 + 3)) == [
        "b",
        "c",
    ]


def test_two_runtimes_on_one_store_see_each_others_commits(store_url):
    """Each runtime resumes a Run from its own last commit, and reads what the other
    appended after it."""
    one, two = qlflow.open(store_url), qlflow.open(store_url)
    try:
        run_id = _start(one, DIAMOND)
        (lease,) = one.lease_attempts("w1", now_ms=T0, start=True)
        assert two.complete(lease, "succeeded", now_ms=T0 + 1) == "succeeded"
        leased = one.lease_attempts("w1", limit=4, now_ms=T0 + 2, start=True)
        assert sorted(x.step_key for x in leased) == ["b", "c"]
        for x in leased:
            assert two.complete(x, "succeeded", now_ms=T0 + 3) == "succeeded"
        (last,) = one.lease_attempts("w1", limit=4, now_ms=T0 + 4, start=True)
        assert one.complete(last, "succeeded", now_ms=T0 + 5) == "succeeded"
        assert one.get_run(run_id).status == "succeeded"
        assert one.verify_projections().ok
    finally:
        one.close()
        two.close()


def test_cancel_many_ends_unheld_runs_in_one_commit_and_leaves_held_work(rt):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    runs = [rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0).run_id for i in range(3)]
    (held,) = rt.lease_attempts("w1", limit=1, now_ms=T0, run_id=runs[2], start=True)
    with commits_by_unit() as units:
        answers = rt.cancel_many([runs[0], runs[1], runs[2], runs[0]], now_ms=T0 + 1)
    assert units == {"cancel": 1}
    assert answers == [True, True, True, False]  # the repeated id: recorded once
    assert [rt.get_run(r).status for r in runs] == ["cancelled", "cancelled", "running"]
    assert rt.get_run(runs[2]).steps["b"].status == "cancelled"  # nobody held it
    assert rt.complete(held, "succeeded", now_ms=T0 + 2) == "cancelled"
    rt.cycle(now_ms=T0 + 3)
    assert rt.get_run(runs[2]).status == "cancelled"
    assert rt.cancel_many(runs, now_ms=T0 + 4) == [False, False, False]
    assert rt.verify_projections().ok


def test_cancel_many_refuses_an_unknown_run_or_reason_and_writes_nothing(rt):
    run_id = _start(rt, DIAMOND)
    before = rt.store.head_position()
    with pytest.raises(NotFound, match="nope"):
        rt.cancel_many([run_id, "nope"], now_ms=T0 + 1)
    with pytest.raises(InvalidInput, match="reason"):
        rt.cancel_many([run_id], reason="whim", now_ms=T0 + 1)
    with pytest.raises(InvalidInput, match="reason"):  # not a str at all
        rt.cancel_many([run_id], reason=[], now_ms=T0 + 1)
    with pytest.raises(InvalidInput, match="run_ids"):
        rt.cancel_many(run_id, now_ms=T0 + 1)
    assert rt.store.head_position() == before
    assert rt.cancel_many([], now_ms=T0 + 1) == []


def test_completion_with_next_work_writes_what_a_lease_after_it_would(two_urls):
    """Store A: `complete_and_lease` takes the worker's next work in its commit. Store
    B: `complete`, then `lease_attempts(start=True)` at the same instant. The same
    records at the same versions (but the actor, and the grants' cause: on A the
    completion they rode on), and the same leases handed back."""
    logs, handed = [], []
    for url, carried in zip(two_urls, (True, False), strict=True):
        rt = qlflow.open(url)
        try:
            run_id = _start(rt, FAN)
            queue = rt.lease_attempts("w1", limit=16, now_ms=T0, start=True)
            got = []
            while queue:
                lease = queue.pop(0)
                if carried:
                    done = rt.complete_and_lease(lease, "succeeded", limit=16, now_ms=T0)
                    assert done.status == "succeeded" and done.error is None
                    more = list(done.next_leases)
                else:
                    rt.complete(lease, "succeeded", now_ms=T0)
                    more = rt.lease_attempts("w1", limit=16, now_ms=T0, start=True)
                assert all(m.started for m in more)
                got.append(sorted((m.step_key, m.lease_id, m.version) for m in more))
                queue += more
            assert rt.get_run(run_id).status == "succeeded"
            log = _log(rt, run_id)
            completed_ids = {e[2] for e in log if e[3] == "lease.completed"}
            causes = {e[5]["causation_id"] for e in log if e[3] == "lease.granted"}
            # A: every grant after the root's names a completion; B: none does
            assert len(causes & completed_ids) == (2 if carried else 0)
            logs.append([_without_grant_cause({**entry[5], "actor": None}, entry) for entry in log])
            handed.append(got)
            assert rt.verify_projections().ok
        finally:
            rt.close()
    assert logs[0] == logs[1]
    assert handed[0] == handed[1]
    assert [len(g) for g in handed[0]] == [6, 0, 0, 0, 0, 0, 1, 0]


def _without_grant_cause(metadata: dict, entry: tuple) -> tuple:
    if entry[3] == "lease.granted":
        metadata = {**metadata, "causation_id": None}
    return (*entry[:5], metadata)


def test_next_work_costs_no_lease_commit(rt):
    run_id = _start(rt, FAN)
    with commits_by_unit() as units:
        queue = rt.lease_attempts("w1", limit=16, now_ms=T0, start=True)
        while queue:
            done = rt.complete_and_lease(queue.pop(0), "succeeded", limit=8, now_ms=T0)
            queue += done.next_leases
    assert rt.get_run(run_id).status == "succeeded"
    # one lease for the root; b..g and h come with the completions that made them ready
    assert units == {"lease_start": 1, "complete": len(FAN)}


def test_next_work_takes_at_most_the_limit_of_the_tasks_asked_for(rt):
    run_id = _start(rt, FAN)
    (root,) = rt.lease_attempts("w1", now_ms=T0, start=True)
    refs = [rt.get_run(run_id).steps[key].task_ref for key in "cef"]
    done = rt.complete_and_lease(root, "succeeded", limit=2, tasks=refs, now_ms=T0 + 1)
    assert [lease.step_key for lease in done.next_leases] == ["c", "e"]
    assert all(lease.worker_id == "w1" and lease.started for lease in done.next_leases)
    steps = rt.get_run(run_id).steps
    assert {k for k, s in steps.items() if s.status == "running"} == {"c", "e"}
    # what it did not take stays claimed for any worker
    others = rt.lease_attempts("w2", limit=16, now_ms=T0 + 2, start=True)
    assert sorted(lease.step_key for lease in others) == ["b", "d", "f", "g"]


def test_next_work_takes_a_limited_task_through_its_slots_and_nothing_of_a_cancelled_run(rt):
    limited = manifest(FAN)
    limited["tasks"]["c"]["concurrency"] = 1
    rt.publish(limited, now_ms=T0)
    first, second, third = (
        rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0).run_id for i in range(3)
    )
    roots = {
        lease.run_id: lease for lease in rt.lease_attempts("w1", limit=3, now_ms=T0, start=True)
    }
    done = rt.complete_and_lease(roots[first], "succeeded", limit=16, now_ms=T0 + 1)
    assert sorted(lease.step_key for lease in done.next_leases) == list("bcdefg")
    # c's one slot is held: the second Run's c waits for it
    done = rt.complete_and_lease(roots[second], "succeeded", limit=16, now_ms=T0 + 2)
    assert sorted(lease.step_key for lease in done.next_leases) == list("bdefg")
    assert rt.get_run(second).steps["c"].status == "ready"
    # under cancel intent a completion leases nothing of its Run
    rt.cancel(third, now_ms=T0 + 3)
    done = rt.complete_and_lease(roots[third], "succeeded", limit=16, now_ms=T0 + 4)
    assert (done.status, done.next_leases) == ("cancelled", ())
    assert rt.verify_projections().ok


def test_next_work_of_one_run_takes_nothing_of_another(rt):
    rt.publish(manifest(FAN), now_ms=T0)
    first, second = (rt.start("demo", "flow", admission_key=k, now_ms=T0).run_id for k in "xy")
    roots = {
        lease.run_id: lease for lease in rt.lease_attempts("w1", limit=2, now_ms=T0, start=True)
    }
    done = rt.complete_and_lease(roots[second], "succeeded", limit=16, run_id=first, now_ms=T0 + 1)
    assert done.next_leases == ()  # the first Run's root is leased; the second's b..g wait
    done = rt.complete_and_lease(roots[first], "succeeded", limit=16, run_id=first, now_ms=T0 + 2)
    assert {lease.run_id for lease in done.next_leases} == {first}
    assert len(rt.lease_attempts("w2", limit=16, run_id=second, now_ms=T0 + 3)) == 6


def test_a_replayed_completion_answers_its_status_and_the_leases_its_commit_granted(rt):
    """A completion sent again (its answer lost) is a replay: answered its status and
    the leases its commit granted that no one recorded running, and nothing new is
    leased (the limit asked for the second time does not matter)."""
    _start(rt, FAN)
    (root,) = rt.lease_attempts("w1", now_ms=T0, start=True)
    first = rt.complete_and_lease(root, "succeeded", limit=2, now_ms=T0 + 1)
    assert [lease.step_key for lease in first.next_leases] == ["b", "c"]
    before = rt.store.head_position()
    again = rt.complete_and_lease(root, "succeeded", limit=16, now_ms=T0 + 2)
    assert again.status == "succeeded" and again.next_leases == first.next_leases
    # once b's worker recorded it running, b is its worker's, not the replay's
    rt.mark_running(first.next_leases[0], now_ms=T0 + 3)
    before = rt.store.head_position()
    late = rt.complete_and_lease(root, "succeeded", limit=16, now_ms=T0 + 4)
    assert [lease.step_key for lease in late.next_leases] == ["c"]
    assert rt.store.head_position() == before
    # d..g stay claimed for any worker
    others = rt.lease_attempts("w2", limit=16, now_ms=T0 + 5)
    assert sorted(lease.step_key for lease in others) == list("defg")


def test_complete_and_lease_refuses_bad_values_and_writes_nothing(rt):
    _start(rt, FAN)
    (root,) = rt.lease_attempts("w1", now_ms=T0, start=True)
    before = rt.store.head_position()
    for bad in ({"limit": 0}, {"limit": 1025}, {"ttl_ms": 10}, {"tasks": "demo@1#b"},
                {"tasks": [""]}, {"slots": -1}):  # fmt: skip
        with pytest.raises(InvalidInput):
            rt.complete_and_lease(root, "succeeded", now_ms=T0 + 1, **bad)
    with pytest.raises(InvalidInput):
        rt.complete_and_lease(root, "maybe", now_ms=T0 + 1)
    assert rt.store.head_position() == before
