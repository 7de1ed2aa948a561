"""A store upgraded to the candidate windows (schema step 4 of projections.runs):
its running Runs are refolded when it is opened and upgraded, and carry on."""

from __future__ import annotations

import pytest

import qlflow
from domain.phases import RUN_PHASES
from projections import candidates, runs, runs_schema
from tests.cycle.helpers import DIAMOND, T0, manifest, work

_OLD_INDEXES = (
    "runs_frontier", "runs_admission", "runs_cancellation", "runs_deadline",
    "attempts_claimable", "attempts_lease_expiry",
)  # fmt: skip


_UNDO_COUNTS = {  # runs schema step 8: the triggers and their table
    "sqlite": [
        *(f"DROP TRIGGER runs_count_{op}" for op in ("insert", "update", "delete")),
        "DROP TABLE run_counts",
    ],
    "postgresql": ["DROP FUNCTION qlflow_count_runs() CASCADE", "DROP TABLE run_counts"],
}


def _back_to_the_flags(rt) -> None:
    """Give the store the schema of projections.runs just before `WORK_STEP`
    (hand-written flags, plan v2's admission instant), as a store from before the
    candidate windows has it."""
    dialect = rt.store.dialect
    with rt.store.transaction() as tx:
        tx.execute("DROP INDEX attempts_ended")  # what step 13 made
        for column in ("worker_host", "worker_slots", "renewed_at_ms"):
            tx.execute(f"ALTER TABLE attempts DROP COLUMN {column}")
        for index in (  # what step 12 made (flow control)
            "attempts_lease_order", "attempts_slot_holders", "runs_slot_queue",
            "runs_slot_holders",
        ):  # fmt: skip
            tx.execute(f"DROP INDEX {index}")
        for column in runs_schema.FLOW_RUN_COLUMNS:
            tx.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        for column in runs_schema.FLOW_ATTEMPT_COLUMNS:
            tx.execute(f"ALTER TABLE attempts DROP COLUMN {column}")
        tx.execute("DROP INDEX runs_finished")  # what step 11 made
        tx.execute("DROP INDEX runs_rerun_of")  # what step 9 made
        tx.execute("ALTER TABLE runs DROP COLUMN rerun_of")
        for column in ("reused_from", "reused_output"):
            tx.execute(f"ALTER TABLE step_runs DROP COLUMN {column}")
        tx.execute("DROP INDEX attempts_active")  # what steps 7 and 8 made
        for sql in _UNDO_COUNTS[dialect]:
            tx.execute(sql)
        for phase in RUN_PHASES:  # what steps 4, 5 and 10 made
            tx.execute(f"DROP INDEX runs_{phase}_work")
        tx.execute("DROP INDEX attempts_grant")
        for column in runs.WINDOW_COLUMNS:
            tx.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        for column in (*runs.GRANT_COLUMNS, "execution"):  # steps 4 and 6
            tx.execute(f"ALTER TABLE attempts DROP COLUMN {column}")
        for flag in ("frontier", "admission", "cancellation"):
            tx.execute(f"ALTER TABLE runs ADD COLUMN needs_{flag} INTEGER NOT NULL DEFAULT 0")
        tx.execute("ALTER TABLE runs ADD COLUMN admission_at_ms BIGINT")
        for sql in runs.MIGRATIONS[0][dialect]:
            if any(f"INDEX {name} " in sql for name in _OLD_INDEXES):
                tx.execute(sql)
        tx.execute(
            "UPDATE schema_versions SET version = ? WHERE component = ?",
            (runs.WORK_STEP - 1, runs.COMPONENT),
        )


@pytest.mark.parametrize("claimed", [False, True])
def test_an_upgraded_store_is_backfilled_at_open(store_url, claimed):
    with qlflow.open(store_url) as rt:
        rt.publish(manifest(DIAMOND), now_ms=T0)
        run_id = rt.start("demo", "flow", admission_key="k1", now_ms=T0).run_id
        if claimed:
            rt.lease_attempts("w1", ttl_ms=5_000, now_ms=T0)  # a's Attempt leased, not started
        before = {phase: candidates.page(rt.store, phase, T0, 10) for phase in RUN_PHASES}
        _back_to_the_flags(rt)
    with qlflow.open(store_url) as rt:  # migrates across WORK_STEP, then refolds the Run
        assert rt.verify_projections().ok
        # step 8 counted the Runs the store already had
        assert rt.store.query("SELECT status, runs FROM run_counts") == [("running", 1)]
        after = {phase: candidates.page(rt.store, phase, T0, 10) for phase in RUN_PHASES}
        assert after == before
        now = T0 + 6_000 if claimed else T0  # w1's lease of a has run out by then
        for _ in range(10):
            rt.cycle(now_ms=now)
            work(rt, now)
            now += 10
        assert rt.get_run(run_id).status == "succeeded"
