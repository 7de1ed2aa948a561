"""One cancel-intent rule: `domain.intent.cancel_intent` over a Run's fields answers
as `effective_intent` does over the aggregate, and a read model's RunView carries
the same fields (the host loop asks with the view it already has)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import qlflow
from domain.aggregate import effective_intent
from domain.cancellation import request_cancel
from domain.intent import cancel_intent
from domain.transitions import CANCEL_REASONS
from tests.cycle.helpers import T0, manifest
from tests.domain.strategies import TTL_MS, reachable_worlds
from tests.domain.test_decisions_properties import PROPERTY

later = st.sampled_from((0, 1, TTL_MS, 10**6, 10**9))


@PROPERTY
@given(reachable_worlds(), st.sampled_from((None, *CANCEL_REASONS)), later)
def test_the_rule_over_a_runs_fields_is_effective_intent(world, reason, extra):
    if reason is not None:
        world.apply(request_cancel(world.agg, reason, world.now_ms))
    now = world.now_ms + extra
    assert cancel_intent(world.agg.run, now) == effective_intent(world.agg, now)


def test_a_run_view_gives_the_intent_its_aggregate_gives(store_url):
    with qlflow.open(store_url) as rt:
        rt.publish(manifest([("a", [])], timeout_ms=1_000), now_ms=T0)
        by_deadline = rt.start("demo", "flow", admission_key="deadline", now_ms=T0).run_id
        cancelled = rt.start("demo", "flow", admission_key="cancel", now_ms=T0).run_id
        rt.cancel(cancelled, reason="policy", now_ms=T0 + 10)
        for run_id in (by_deadline, cancelled):
            for now in (T0 + 5, T0 + 999, T0 + 1_000, T0 + 5_000):
                view, aggregate = rt.get_run(run_id), rt.aggregate_at(run_id)
                assert cancel_intent(view, now) == effective_intent(aggregate, now), (run_id, now)
        assert cancel_intent(rt.get_run(by_deadline), T0 + 1_000) == ("timeout", T0 + 1_000)
        assert cancel_intent(rt.get_run(cancelled), T0 + 5) == ("policy", T0 + 10)
