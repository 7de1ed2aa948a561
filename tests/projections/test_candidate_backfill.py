"""A store upgraded to the candidate windows (schema step 3 of projections.runs):
its running Runs are refolded at the next writable open, and carry on."""

from __future__ import annotations

import pytest

import qlflow
from projections import candidates, runs
from tests.cycle.helpers import DIAMOND, T0, manifest, work


def _as_just_upgraded(rt) -> None:
    """What step 3 leaves in a store it upgrades: no windows, but an unknown
    opening (-1) on every running Run and claimed Attempt (its own UPDATEs)."""
    updates = [sql for sql in runs.MIGRATIONS[2]["sqlite"] if sql.startswith("UPDATE")]
    assert len(updates) == 2
    with rt.store.transaction() as tx:
        tx.execute(f"UPDATE runs SET {', '.join(f'{c} = NULL' for c in runs.WINDOW_COLUMNS)}")
        tx.execute(f"UPDATE attempts SET {', '.join(f'{c} = NULL' for c in runs.GRANT_COLUMNS)}")
        for sql in updates:
            tx.execute(sql)


@pytest.mark.parametrize("claimed", [False, True])
def test_an_upgraded_store_is_backfilled_at_open(store_url, claimed):
    with qlflow.open(store_url) as rt:
        rt.publish(manifest(DIAMOND), now_ms=T0)
        run_id = rt.start("demo", "flow", admission_key="k1", now_ms=T0).run_id
        if claimed:
            rt.cycle(now_ms=T0)  # a's Attempt is claimed, not leased
        before = {phase: candidates.page(rt.store, phase, T0, 10) for phase in candidates.PHASES}
        _as_just_upgraded(rt)
        # unknown: a candidate of every phase at any instant, whatever the decisions say
        for phase in candidates.PHASES:
            assert candidates.page(rt.store, phase, 0, 10) == [run_id]
    with qlflow.open(store_url) as rt:
        assert rt.verify_projections().ok
        after = {phase: candidates.page(rt.store, phase, T0, 10) for phase in candidates.PHASES}
        assert after == before
        now = T0
        for _ in range(10):
            rt.cycle(now_ms=now)
            work(rt, now)
            now += 10
        assert rt.get_run(run_id).status == "succeeded"
