"""`Runtime.rerun` on both stores: reuse with lineage, the admission's exactly-once,
the start guard, plan same/head, and every bad input typed with nothing written."""

from __future__ import annotations

import pytest

import qlflow
from domain.errors import InvalidInput, NotFound, StartGuardError
from domain.rerun import RerunRefused
from tests.rerun.support import T0, drive, failed_run, manifest


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def _positions(rt) -> int:
    return rt.store.head_position()


def test_a_rerun_reuses_what_succeeded_and_starts_the_failed_step_at_once(rt):
    source = failed_run(rt)

    receipt = rt.rerun(source, now_ms=T0 + 10)

    run = rt.get_run(receipt.run_id)
    assert run.rerun_of == source
    assert {k: s.status for k, s in run.steps.items()} == {
        "fetch": "succeeded", "left": "succeeded", "right": "ready", "join": "pending",
    }  # fmt: skip
    old = rt.get_run(source)
    for key in ("fetch", "left"):
        assert run.steps[key].reused_from == {
            "run_id": source,
            "attempt_id": old.steps[key].attempts[-1].attempt_id,
        }
        assert run.steps[key].output == {"step": key}
        assert run.steps[key].attempts == []
    # the failed step was claimed in the admission's commit: no cycle before the lease
    (lease,) = rt.lease_attempts("w1", now_ms=T0 + 11, run_id=receipt.run_id)
    assert lease.step_key == "right"
    rt.complete(rt.mark_running(lease, now_ms=T0 + 12), "succeeded", now_ms=T0 + 12)
    assert drive(rt, receipt.run_id, T0 + 13) == ["join"]
    assert rt.get_run(receipt.run_id).status == "succeeded"
    assert rt.get_run(source).status == "failed"  # the source is as it was


def test_the_dependents_of_a_reused_step_get_its_output(rt):
    source = failed_run(rt)
    receipt = rt.rerun(source, now_ms=T0 + 10)
    ran = drive(rt, receipt.run_id, T0 + 11)
    assert ran == ["right", "join"]
    assert rt.get_run(receipt.run_id).status == "succeeded"
    # join's inputs: left reused, right run again
    rerun_again = rt.rerun(receipt.run_id, from_steps=["join"], now_ms=T0 + 20)
    (lease,) = rt.lease_attempts("w1", now_ms=T0 + 21, run_id=rerun_again.run_id)
    assert lease.step_key == "join"
    assert rt.task_inputs(lease)["needs"] == {"left": {"step": "left"}, "right": {"step": "right"}}
    # a reuse of a reused step names the Run that ran it
    chain = rt.get_run(rerun_again.run_id)
    assert chain.steps["left"].reused_from["run_id"] == source
    assert chain.steps["right"].reused_from["run_id"] == receipt.run_id
    assert rt.verify_projections().ok


def test_from_steps_run_those_and_their_downstream(rt):
    rt.publish(manifest(), now_ms=T0)
    source = rt.start("daily", "nightly", now_ms=T0).run_id
    drive(rt, source, T0)
    assert rt.get_run(source).status == "succeeded"

    receipt = rt.rerun(source, from_steps=["left"], now_ms=T0 + 5)

    run = rt.get_run(receipt.run_id)
    reused = sorted(k for k, s in run.steps.items() if s.reused_from)
    assert reused == ["fetch", "right"]
    assert drive(rt, receipt.run_id, T0 + 6) == ["left", "join"]
    assert rt.get_run(receipt.run_id).status == "succeeded"
    assert [r.run_id for r in rt.runs(rerun_of=source)] == [receipt.run_id]


def test_the_same_key_gives_the_same_rerun_and_the_default_key_counts(rt):
    source = failed_run(rt)
    first = rt.rerun(source, admission_key="again", now_ms=T0 + 10)
    replay = rt.rerun(source, admission_key="again", now_ms=T0 + 11)
    assert (first.status, replay.status) == ("created", "existing")
    assert replay.run_id == first.run_id

    one = rt.rerun(source, now_ms=T0 + 12)
    two = rt.rerun(source, now_ms=T0 + 13)
    assert one.admission_key == f"rerun:{source}:1"
    assert two.admission_key == f"rerun:{source}:2"
    assert len({first.run_id, one.run_id, two.run_id}) == 3
    assert sorted(r.run_id for r in rt.runs(rerun_of=source)) == sorted(
        [first.run_id, one.run_id, two.run_id]
    )


def test_a_running_run_is_not_rerun(rt):
    rt.publish(manifest(), now_ms=T0)
    source = rt.start("daily", "nightly", now_ms=T0).run_id
    before = _positions(rt)
    with pytest.raises(RerunRefused, match="still running") as refused:
        rt.rerun(source, now_ms=T0 + 1)
    assert refused.value.rule == "running"
    assert _positions(rt) == before


def test_bad_input_is_typed_and_writes_nothing(rt):
    source = failed_run(rt)
    rt.publish({**manifest(), "workflows": {"other": {"steps": [{"key": "x", "task": "work"}]}}},
               now_ms=T0 + 1)  # fmt: skip
    before = _positions(rt)
    with pytest.raises(NotFound):
        rt.rerun("run:nope", now_ms=T0 + 2)
    with pytest.raises(RerunRefused, match="no step 'nope'") as unknown:
        rt.rerun(source, from_steps=["nope"], now_ms=T0 + 2)
    assert unknown.value.steps == ("nope",)
    with pytest.raises(RerunRefused, match="no step 'x'"):  # a step of another Workflow
        rt.rerun(source, from_steps=["x"], now_ms=T0 + 2)
    with pytest.raises(InvalidInput, match="binds its parameters"):
        rt.rerun(source, params={"day": "tue"}, now_ms=T0 + 2)
    with pytest.raises(InvalidInput, match="plan must be one of"):
        rt.rerun(source, plan="latest", now_ms=T0 + 2)
    with pytest.raises(InvalidInput, match="from_steps"):
        rt.rerun(source, from_steps="left", now_ms=T0 + 2)
    assert _positions(rt) == before


def test_a_head_rerun_refuses_reused_steps_that_changed_then_takes_them(rt):
    source = failed_run(rt)
    rt.publish(manifest(fetch_command="false", extra_step=True), now_ms=T0 + 1)
    before = _positions(rt)
    with pytest.raises(RerunRefused, match="fetch") as refused:
        rt.rerun(source, plan="head", now_ms=T0 + 2)
    assert refused.value.steps == ("fetch",)
    with pytest.raises(InvalidInput):  # params must fit the bound plan
        rt.rerun(source, plan="head", from_steps=["fetch"], params={"nope": 1}, now_ms=T0 + 2)
    assert _positions(rt) == before

    receipt = rt.rerun(
        source, plan="head", from_steps=["fetch"], params={"day": "tue"}, now_ms=T0 + 3
    )
    run = rt.get_run(receipt.run_id)
    assert run.params == {"day": "tue"}
    assert not any(s.reused_from for s in run.steps.values())
    assert "report" in run.steps


def test_a_head_rerun_reuses_unchanged_steps(rt):
    source = failed_run(rt)
    rt.publish(manifest(extra_step=True), now_ms=T0 + 1)
    receipt = rt.rerun(source, plan="head", now_ms=T0 + 2)
    run = rt.get_run(receipt.run_id)
    assert sorted(k for k, s in run.steps.items() if s.reused_from) == ["fetch", "left"]
    assert drive(rt, receipt.run_id, T0 + 3) == ["right", "join", "report"]


def test_a_revoked_publishers_package_is_not_rerun(rt):
    source = failed_run(rt)
    rt.revoke_publisher("acme", now_ms=T0 + 1)
    before = _positions(rt)
    with pytest.raises(StartGuardError):
        rt.rerun(source, now_ms=T0 + 2)
    assert _positions(rt) == before


def test_a_same_plan_rerun_binds_its_superseded_publication(rt):
    source = failed_run(rt)
    published = rt.get_run(source).publication_id
    rt.publish(manifest(extra_step=True), now_ms=T0 + 1)  # a new head supersedes it
    receipt = rt.rerun(source, now_ms=T0 + 2)
    run = rt.get_run(receipt.run_id)
    assert run.publication_id == published and "report" not in run.steps
    assert run.params == rt.get_run(source).params  # the digest covers the run id: not equal
    assert drive(rt, receipt.run_id, T0 + 3) == ["right", "join"]
