"""The inspection API on both stores, with explicit times: the runs search (filters,
keyset pages both ways, counts), short ids that always resolve, the ambiguous prefix,
step logs through the Runtime (and a follower's cursor), and `why` naming every step
that failed, timed out or was lost whatever ended the Run."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qlflow
from projections.views import cursor_of
from qlflow.errors import AmbiguousId, InvalidInput, NotFound
from tests.cycle.helpers import T0, manifest, work
from tests.hypothesis_budget import examples


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        runtime.publish(manifest([("a", []), ("b", [])]), now_ms=T0)
        runtime.publish(manifest([("x", [])], package="other", workflow="job"), now_ms=T0)
        yield runtime


def _start(rt, number: int, package: str = "demo", workflow: str = "flow") -> str:
    return rt.start(package, workflow, run_id=f"r{number:02d}", now_ms=T0 + number).run_id


def test_runs_search_pages_both_ways_and_counts(rt):
    ids = [_start(rt, n, *(("other", "job") if n % 3 == 0 else ())) for n in range(1, 13)]
    newest_first = ids[::-1]

    assert [r.run_id for r in rt.runs()] == newest_first
    demo = [r for r in newest_first if int(r[1:]) % 3]
    assert [r.run_id for r in rt.runs(package="demo")] == demo
    assert [r.run_id for r in rt.runs(workflow="job", limit=2)] == ["r12", "r09"]
    assert [r.run_id for r in rt.runs(since_ms=T0 + 5, until_ms=T0 + 8)] == ["r07", "r06", "r05"]
    assert [r.run_id for r in rt.runs(id_prefix="r1")] == ["r12", "r11", "r10"]
    assert rt.count_runs(package="demo") == len(demo)
    assert rt.count_runs(at_most=3) == 4  # "more than 3"

    page = rt.runs(limit=5)
    older = rt.runs(limit=5, before=cursor_of(page[-1]))
    assert [r.run_id for r in page + older] == newest_first[:10]
    back = rt.runs(limit=5, after=cursor_of(older[0]))
    assert back == page
    assert rt.runs(limit=5, after=cursor_of(page[0])) == []
    with pytest.raises(InvalidInput):
        rt.runs(before=cursor_of(page[0]), after=cursor_of(page[0]))
    with pytest.raises(InvalidInput):
        rt.runs(status="sad")
    assert page[0].step_count == 1 and page[0].open_steps == 1  # r12: other/job, one step


def test_short_ids_resolve_and_an_ambiguous_prefix_lists_its_matches(rt):
    twins = ["run:0123456789ab" + tail for tail in ("0" * 20, "f" * 20)]
    for number, run_id in enumerate(twins):
        rt.start("demo", "flow", run_id=run_id, now_ms=T0 + number)
    derived = rt.start("demo", "flow", admission_key="nightly-1", now_ms=T0 + 9).run_id
    hand = _start(rt, 50)

    shorts = rt.short_run_ids([*twins, derived, hand])
    assert shorts[twins[0]] == "0123456789ab0" and shorts[twins[1]] == "0123456789abf"
    assert len(shorts[derived]) == 8 and derived == "run:" + shorts[derived] + derived[12:]
    assert shorts[hand] == hand  # an id chosen by hand is shown whole
    for run_id, short in shorts.items():
        assert rt.resolve_run_id(short) == run_id
    assert rt.resolve_run_id("run:" + shorts[derived]) == derived
    with pytest.raises(AmbiguousId) as ambiguous:
        rt.resolve_run_id("0123456789a")
    assert ambiguous.value.candidates == tuple(twins)
    assert "0123456789a" in str(ambiguous.value) and twins[1] in str(ambiguous.value)
    with pytest.raises(NotFound):
        rt.resolve_run_id("fedcba")


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(keys=st.lists(st.text("ab", min_size=1, max_size=6), min_size=1, max_size=12, unique=True))
def test_every_short_id_names_its_run(sqlite_url, keys):
    with qlflow.open(sqlite_url) as runtime:
        runtime.publish(manifest([("a", [])]), now_ms=T0)
        ids = [runtime.start("demo", "flow", admission_key=k, now_ms=T0).run_id for k in keys]
        shorts = runtime.short_run_ids(ids)
        assert all(runtime.resolve_run_id(shorts[r]) == r for r in ids)
        assert all(len(shorts[r]) >= 8 for r in ids)


def test_step_logs_through_the_runtime(rt):
    run_id = _start(rt, 1)
    rt.cycle(now_ms=T0 + 10)
    [lease, other] = rt.lease_attempts("w1", limit=2, now_ms=T0 + 11)
    rt.append_log(lease.attempt_id, [("stdout", T0 + 12, b"one\n"), ("stderr", T0 + 12, b"two\n")])
    first = rt.logs(run_id, lease.step_key)
    assert [(c.step_key, c.attempt_number, c.stream, c.text) for c in first] == [
        (lease.step_key, 1, "stdout", "one\n"),
        (lease.step_key, 1, "stderr", "two\n"),
    ]
    rt.append_log(lease.attempt_id, [("stdout", T0 + 13, b"three\n")])
    cursor = {lease.attempt_id: first[-1].seq}
    assert [c.text for c in rt.logs(run_id, after=cursor)] == ["three\n"]
    assert rt.logs(run_id, other.step_key) == []
    assert rt.last_log_lines(lease.attempt_id, 2) == ["two", "three"]
    assert [a.attempt_id for a in rt.log_attempts(run_id, lease.step_key, 1)] == [lease.attempt_id]
    assert rt.logs(run_id, lease.step_key, lease.attempt_id) == rt.logs(run_id, lease.step_key, 1)
    with pytest.raises(InvalidInput):
        rt.logs(run_id, attempt=1)  # a number counts within one step
    with pytest.raises(InvalidInput):
        rt.logs(run_id, "nope")
    with pytest.raises(InvalidInput):
        rt.append_log(lease.attempt_id, [("stdin", T0, b"x")])
    assert rt.resolve_attempt_id(lease.attempt_id[4:14], run_id) == lease.attempt_id
    pruned = rt.prune_logs(T0 + 14)
    assert (pruned.attempts, pruned.chunks) == (1, 3)
    assert rt.logs(run_id) == []


def test_why_names_a_failure_that_came_before_the_cancel(rt):
    run_id = _start(rt, 1)
    rt.cycle(now_ms=T0 + 10)
    leases = {lease.step_key: lease for lease in rt.lease_attempts("w1", limit=2, now_ms=T0 + 11)}
    for lease in leases.values():
        rt.mark_running(lease, now_ms=T0 + 12)
    rt.append_log(leases["a"].attempt_id, [("stderr", T0 + 13, b"ERROR: disk on fire\n")])
    rt.complete(leases["a"], "failed", execution={"exit_code": 7}, now_ms=T0 + 14)
    rt.cancel(run_id, now_ms=T0 + 15)
    rt.complete(leases["b"], "succeeded", now_ms=T0 + 16)
    rt.cycle(now_ms=T0 + 17)

    report = rt.why(run_id, now_ms=T0 + 18)
    assert report.status == "cancelled" and report.root_cause.kind == "cancel_intent"
    [failure] = report.failures
    assert (failure.step_key, failure.status, failure.result_code, failure.exit_code) == (
        "a",
        "failed",
        "execution_failed",
        7,
    )
    assert failure.last_lines == ("ERROR: disk on fire",)
    lines = report.lines()
    assert "step 'a' failed (execution_failed, exit 7)" in "\n".join(lines)
    assert "  | ERROR: disk on fire" in lines
    assert rt.why(run_id, now_ms=T0 + 18, log_lines=0).failures[0].last_lines == ()


def test_why_names_a_lost_attempt_and_a_timed_out_step(rt):
    run_id = rt.start("demo", "flow", run_id="lost-1", timeout_ms=60_000, now_ms=T0).run_id
    rt.cycle(now_ms=T0 + 1)
    leases = {
        lease.step_key: lease
        for lease in rt.lease_attempts("w1", limit=2, ttl_ms=5_000, now_ms=T0 + 2)
    }
    rt.mark_running(leases["a"], now_ms=T0 + 3)  # then the worker vanishes
    rt.complete(rt.mark_running(leases["b"], now_ms=T0 + 3), "succeeded", now_ms=T0 + 4)
    rt.cycle(now_ms=T0 + 10_000)  # recovery: a's lease ran out after it started

    report = rt.why(run_id, now_ms=T0 + 10_001)
    assert [(f.step_key, f.status, f.result_code) for f in report.failures] == [
        ("a", "lost", "lease_expired")
    ]

    timed = rt.start("demo", "flow", run_id="slow-1", timeout_ms=1_000, now_ms=T0).run_id
    rt.cycle(now_ms=T0 + 2_000)
    rt.cycle(now_ms=T0 + 2_001)
    work(rt, T0 + 2_002)
    rt.cycle(now_ms=T0 + 2_003)
    ended = rt.why(timed, now_ms=T0 + 2_004)
    assert ended.status == "timed_out"
    assert {(f.step_key, f.status) for f in ended.failures} == {
        ("a", "timed_out"),
        ("b", "timed_out"),
    }
