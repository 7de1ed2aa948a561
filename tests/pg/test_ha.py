"""Physical HA: a synchronous (remote_apply) streaming standby is promoted after the
old primary is fenced, and every operation replayed on the new primary is exact
(bench/pg_ha.py holds the harness; `python -m bench.pg_ha` writes the same report).

Needs the PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup, pg_rewind), not
QLFLOW_TEST_PG_URL: the clusters are made from scratch on free local ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench import pg_ha

pytestmark = [
    pytest.mark.ha,  # CI fails when these skip (.ci/check_report)
    pytest.mark.skipif(
        pg_ha.skip_reason() is not None, reason=pg_ha.skip_reason() or "HA harness available"
    ),
]


@pytest.fixture
def pair() -> Iterator[pg_ha.HaPair]:
    ha_pair = pg_ha.HaPair()
    try:
        yield ha_pair
    finally:
        ha_pair.close()
        _assert_cleaned_up(ha_pair)


def _assert_cleaned_up(ha_pair: pg_ha.HaPair) -> None:
    assert not ha_pair.root.exists(), "the cluster directories are removed"


def test_failover_keeps_every_commit_and_replays_exactly(pair):
    report = pg_ha.run_failover(pair)
    values = report["values"]
    failed = sorted(name for name, passed in values["checks"].items() if not passed)
    assert failed == []
    assert report["gates"] == pg_ha.EXPECTED_GATES
    assert report["passed"] is True

    assert (values["timeline_before"], values["timeline_after"]) == (1, 2)
    assert values["wal_file_after"].startswith("00000002")
    assert values["replication"] == [[pg_ha.STANDBY_NAME, "streaming", "sync"]]
    # the Run cancelled on the old primary, then replayed on the new one, unchanged
    assert values["primary"]["halt_status"] == values["halt"]["status"] == "cancelled"
    assert values["halt"]["steps"] == {"x": "cancelled", "y": "cancelled"}
    assert set(values["halt"]["leases"].values()) <= {"completed@v2", "completed@v3"}
    # the lost completion carried the Run's end: recomputed, it replays onto both
    assert "lease.completed" in values["replayed_records"]["completion"]
    assert "workflow.cancelled" in values["replayed_records"]["completion"]
    # the Run in flight across the failover finished on the new primary
    assert values["primary"]["main_status"] == "running"
    assert values["new_primary"]["main_status"] == "succeeded"
    assert values["new_primary"]["fresh_run_status"] == "succeeded"
    assert values["new_primary"]["events_after"] > values["events_before_failover"]
    # the old primary came back only as a read-only follower on the new timeline
    assert values["old_primary_follows"] == [[2, "streaming"]]


def test_a_failing_run_still_stops_every_server_and_removes_its_files():
    ha_pair = pg_ha.HaPair()
    pids: list[int] = []
    try:
        with pytest.raises(RuntimeError, match="boom"), ha_pair:
            ha_pair.build()
            pids = [c.postmaster_pid() for c in ha_pair.clusters]
            raise RuntimeError("boom")
    finally:
        ha_pair.close()
    assert len(pids) == 2 and all(pids)
    assert not any(pg_ha.process_alive(pid) for pid in pids)
    _assert_cleaned_up(ha_pair)
