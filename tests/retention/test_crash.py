"""SIGKILL at every retention commit point, on both stores: a child process runs
`retain` with an archive and kills itself at the point; after it each Run is either
whole or gone (never half), the log verifies, and a second `retain` finishes the job
with every removed Run in the archive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import qlflow
from domain.errors import NotFound
from domain.values import receipt_stream_id
from qlflow import archive as archiving
from tests.rerun.support import T0
from tests.retention.support import finished_runs

REPO = Path(__file__).resolve().parents[2]
POINTS = [
    "retention.after_begin",
    "retention.archived",
    "retention.recorded",
    "retention.deleted",
    "retention.before_commit",
    "retention.after_commit",
]
CHILD = """
import sys, qlflow
with qlflow.open(sys.argv[1]) as rt:
    rt.retain(int(sys.argv[2]), batch=2, archive=sys.argv[3], now_ms=int(sys.argv[4]))
"""


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_a_commit_point_leaves_each_run_whole_or_gone(store_url, tmp_path, point):
    with qlflow.open(store_url) as rt:
        run_ids = finished_runs(rt, 5)
    archive = tmp_path / "old.db"
    cutoff, now = T0 + 3500, T0 + 10_000
    env = {**os.environ, "QLFLOW_FAULT": f"{point}=kill", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, store_url, str(cutoff), str(archive), str(now)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr

    with qlflow.open(store_url) as rt:
        gone = []
        for run_id in run_ids:
            try:
                view = rt.get_run(run_id)
            except NotFound as error:
                assert "pruned by retention" in str(error)
                gone.append(run_id)
            else:
                assert view.status == "succeeded"
                assert len(view.steps) == 4 and all(
                    s.status == "succeeded" for s in view.steps.values()
                )
        # the first batch (two Runs) committed only when the kill came after COMMIT
        assert gone == (run_ids[:2] if point == "retention.after_commit" else [])
        _keys_answer(rt, run_ids, gone)
        assert rt.verify_projections().ok

        report = rt.retain(cutoff, batch=2, archive=archive, now_ms=now)

        assert sorted(gone + report.run_ids) == sorted(run_ids[:4])
        assert rt.verify_projections().ok
        for run_id in run_ids[:4]:
            assert archiving.archived_aggregate(archive, run_id).run.status == "succeeded"
        assert rt.get_run(run_ids[4]).status == "succeeded"
        _keys_answer(rt, run_ids, run_ids[:4])
        rt.rebuild_projections()
        assert rt.verify_projections().ok
        _keys_answer(rt, run_ids, run_ids[:4])


def _keys_answer(rt, run_ids, gone) -> None:
    """Each Run's admission key goes with it or stays with it: a removed Run's key
    answers from its tombstone (receipt stream gone), a kept one's from its stream."""
    for n, run_id in enumerate(run_ids):
        key = f"key-{n}"
        receipt = rt.inspect_admission(admission_key=key)
        assert receipt is not None and receipt.run_id == run_id
        stream = rt.store.read_stream(receipt_stream_id(key))
        if run_id in gone:
            assert (stream, len(receipt.steps)) == ([], 0)
            assert receipt.removed.startswith("removed by retention at")
        else:
            assert len(stream) == 1 and receipt.removed is None and receipt.steps
