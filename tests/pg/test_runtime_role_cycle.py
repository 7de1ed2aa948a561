"""The Cluster cycle flow connected as the least-privilege roles: every end-to-end
and lost-COMMIT-response scenario of tests/cycle, unchanged, with publishing done as
publisher-admin and admission, cycles and workers as the runtime role (the `rt`
fixture of tests/pg/conftest.py)."""

from __future__ import annotations

import inspect

import pytest

import qlflow
from tests.cycle import test_end_to_end, test_faults_and_async
from tests.cycle.helpers import DIAMOND, T0, drive, manifest

pytestmark = pytest.mark.pg


def _scenarios(module) -> dict[str, object]:
    """The module's tests that need nothing but a runtime (`rt`)."""
    return {
        name: test
        for name, test in vars(module).items()
        if name.startswith("test_")
        and callable(test)
        and list(inspect.signature(test).parameters) == ["rt"]
    }


END_TO_END = _scenarios(test_end_to_end)


@pytest.mark.parametrize("scenario", sorted(END_TO_END))
def test_end_to_end_scenario_as_runtime_role(rt, scenario):
    END_TO_END[scenario](rt)


def test_every_end_to_end_scenario_is_reused():
    # a scenario that grew a second fixture would silently drop out of this suite
    declared = [name for name in vars(test_end_to_end) if name.startswith("test_")]
    assert sorted(declared) == sorted(END_TO_END)
    assert len(END_TO_END) >= 15


@pytest.mark.parametrize("phase", ["frontier", "claim", "cancellation"])
def test_lost_commit_response_replayed_exactly_as_runtime_role(rt, phase):
    test_faults_and_async.test_lost_commit_response_in_a_cycle_is_replayed_exactly(rt, phase)


def test_streams_stay_contiguous_as_runtime_role(rt):
    test_faults_and_async.test_every_stream_stays_contiguous_after_a_busy_workload(rt)


def test_owner_verifies_and_rebuilds_what_the_runtime_wrote(rt, roles):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    drive(rt, T0)
    with qlflow.open(roles.owner) as owner:
        assert owner.verify_projections().ok
        owner.rebuild_projections()
        assert owner.verify_projections().ok
        assert owner.get_run(run_id).status == "succeeded"


def test_audit_role_reads_the_whole_log_the_runtime_wrote(rt, roles):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    drive(rt, T0)
    with qlflow.open(roles.audit) as audit:
        seen = [record.stream_id for record in audit.store.iter_all(0)]
        assert audit.get_run(run_id).status == "succeeded"
        assert [e.event_id for e in audit.events(run_id)] == [e.event_id for e in rt.events(run_id)]
    runtime_seen = [record.stream_id for record in rt.store.iter_all(0)]
    # the audit role sees the publication too; the runtime role sees everything else
    assert [s for s in seen if not s.startswith("publication-")] == runtime_seen
    assert any(s.startswith("publication-") for s in seen)
