"""What a step is given, whichever way the runtime came by its Run: from the Run its
own write left (the lease's grant) or from the read models (docs/DESIGN.md "What a
step is given")."""

from __future__ import annotations

import pytest

import qlflow
from projections import task_io
from tests.api.test_plan_v2 import T0, _lease, _run, manifest


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def test_a_steps_inputs_are_the_same_from_the_run_written_here_and_from_the_read_models(
    rt, store_url
):
    """The runtime that granted a lease hands the step its inputs from the Run its own
    write left (no read); another runtime on the same store reads the read models.
    Both answer what the step is given: parameters, the needs' outputs, which Attempt
    this is and how many the step may have — and the Run's publication."""
    rt.publish(manifest(max_attempts=3, backoff_ms=1_000), now_ms=T0)
    run_id = rt.start("daily", "nightly", params={"date": "2026-12-01"}, now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    _run(rt, T0, "succeeded", {"rows": 7})
    rt.cycle(now_ms=T0 + 1)
    _run(rt, T0 + 1, "failed")
    rt.cycle(now_ms=T0 + 1_002)
    lease = _lease(rt, T0 + 1_002)
    held = rt._authority.aggregates.get(run_id)
    assert held is not None and lease.attempt_id in held.attempts  # the path under test
    with qlflow.open(store_url) as other:
        assert other._authority.aggregates.get(run_id) is None
        expected = {
            "params": {"date": "2026-12-01", "dry": False, "limit": 10},
            "needs": {"fetch": {"rows": 7}},
        }
        assert rt.task_inputs(lease) == other.task_inputs(lease) == expected
        # the Run's publication, which a host resolves the step's Task from, alike
        publication = rt.get_run(run_id).publication_id
        assert rt._publication_of(run_id) == other._publication_of(run_id) == publication
        here = task_io.attempt_inputs(rt._run_holding(lease), "load", lease.attempt_id)
        there = task_io.attempt_inputs(other._run_holding(lease), "load", lease.attempt_id)
    assert here == there == task_io.AttemptInputs(expected, 2, 3)
