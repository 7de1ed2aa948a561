"""The host's structured log: every event a commit makes is one JSON object with its
ids, and a store error is one too (real SQLite store, a real held write lock)."""

from __future__ import annotations

import logging
import sqlite3

import orjson
import pytest

import qlflow
from domain.errors import StoreUnavailable
from qlflow import event_log
from tests.cycle.helpers import DIAMOND, T0, drive, manifest
from tests.observability.workloads import eventful, retrying_diamond


class Lines(logging.Handler):
    """Formats what it is handed as the json format does, one line each."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(event_log.JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def lines():
    handler = Lines()
    logger = logging.getLogger("qlflow.events")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_every_event_of_a_workload_is_a_json_line_with_its_ids(store_url, lines):
    rt = qlflow.open(store_url)
    stop = event_log.log_commits(rt.store)
    try:
        rt.publish(retrying_diamond(), now_ms=T0)
        run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
        drive(rt, T0, outcomes={"c": "failed"})
    finally:
        stop()
        rt.close()
    events = [orjson.loads(line) for line in lines.lines]
    assert all("\n" not in line for line in lines.lines)
    kinds = [e["event"] for e in events]
    assert kinds.count("lease") == 4  # a, b, c twice (one retry); d is skipped
    assert kinds.count("completion") == 4
    [retry] = [e for e in events if e["event"] == "retry"]
    assert (retry["run_id"], retry["step_key"]) == (run_id, "c")
    assert retry["attempt_id"] and retry["retry_at_ms"] >= T0
    [ended] = [e for e in events if e["event"] == "run_ended"]
    assert (ended["run_id"], ended["status"]) == (run_id, "failed")
    for event in events:
        if event["event"] in ("lease", "completion"):
            assert event["run_id"] == run_id and event["attempt_id"] and event["step_key"]


def test_a_store_error_is_a_json_line_with_its_reason(tmp_path, lines):
    path = tmp_path / "q.db"
    rt = qlflow.open(f"sqlite:///{path}?busy_timeout_ms=50")
    stop = event_log.log_commits(rt.store)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable) as raised:
            rt.publish(manifest(DIAMOND), now_ms=T0)
        holder.execute("ROLLBACK")
    finally:
        holder.close()
        stop()
        rt.close()
    [error] = [orjson.loads(line) for line in lines.lines]
    assert (error["event"], error["level"]) == ("store_error", "warning")
    assert error["reason"] == raised.value.reason


def test_expiry_interruption_and_schedules_are_json_lines_with_their_ids(store_url, lines):
    rt = qlflow.open(store_url)
    stop = event_log.log_commits(rt.store)
    try:
        run_id = eventful(rt)
        log = list(rt.store.iter_all(0))
    finally:
        stop()
        rt.close()
    events = [orjson.loads(line) for line in lines.lines]
    by_kind: dict[str, list[dict]] = {}
    for event in events:
        by_kind.setdefault(event["event"], []).append(event)
    # the Attempt whose lease expired before it started: a completion, lost
    [lost] = [e for e in by_kind["completion"] if e["outcome"] == "lost"]
    assert (lost["run_id"], lost["step_key"], lost["result_code"]) == (run_id, "a", "lease_expired")
    [stopped] = by_kind["interruption"]
    interrupted = [r for r in log if r.type == "attempt.interrupted"]
    assert stopped["attempt_id"] == interrupted[0].data["attempt_id"]
    assert (stopped["run_id"], stopped["step_key"]) == (run_id, "a")
    assert stopped["result_code"] == "worker_shutdown"
    [fired] = by_kind["schedule_fired"]
    [fire] = [r for r in log if r.type == "schedule.fired"]
    assert fired["schedule_id"] == fire.stream_id.removeprefix("schedule-")
    assert (fired["run_id"], fired["scheduled_for_ms"]) == (
        fire.data["run_id"], fire.data["scheduled_for_ms"],
    )  # fmt: skip
    [skipped] = by_kind["schedule_skipped"]
    assert (skipped["schedule_id"], skipped["reason"]) == (fired["schedule_id"], "late")
    # one lease line per grant the log holds, each with its ids
    grants = [r.data for r in log if r.type == "lease.granted"]
    assert [(e["lease_id"], e["attempt_id"]) for e in by_kind["lease"]] == [
        (g["lease_id"], g["attempt_id"]) for g in grants
    ]
