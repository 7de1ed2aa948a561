"""Run snapshots on both stores: a long Run loads from its snapshot (fewer records
read, the same aggregate), a snapshot that is not the fold of the log is a named
verify difference and never decides, rebuild drops them and verify is clean."""

from __future__ import annotations

import hashlib

import orjson
import pytest

import qlflow
from actors.loading import RunStreams, read_run_streams
from domain.event_types import EventType
from domain.streams import lease_stream, run_stream, steps_stream
from projections.rebuild import rebuild
from projections.snapshots import SNAPSHOT_EVERY
from projections.verify import SNAPSHOT, verify
from tests.projections.workload import T0, TTL_MS, manifest

STEPS = 128
CHAIN = [(f"s{i:03d}", [f"s{i - 1:03d}"] if i else []) for i in range(STEPS)]
RUN = "long-1"


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    runtime.publish(manifest(CHAIN, workflow="chain"), now_ms=T0)
    runtime.start("demo", "chain", admission_key="k", run_id=RUN, now_ms=T0)
    yield runtime
    runtime.close()


def run_steps(rt, count: int) -> None:
    """Complete the next `count` Steps of the chain (one lease at a time)."""
    done = 0
    while done < count:
        rt.cycle(now_ms=T0 + 1)
        for lease in rt.lease_attempts("w1", ttl_ms=TTL_MS, now_ms=T0 + 1, start=True):
            rt.complete(lease, "succeeded", now_ms=T0 + 1)
            done += 1


def snapshot_row(store):
    rows = store.query("SELECT run_version, steps_version, document FROM run_snapshots")
    return rows[0] if rows else None


def whole_streams(tx, run_id: str) -> RunStreams:
    """Every record of the Run's streams from the first, read stream by stream."""
    run = tx.read_stream(run_stream(run_id))
    claimed = [r.data["attempt_id"] for r in run if r.type == EventType.ATTEMPT_CLAIMED]
    leases = {a: tx.read_stream(lease_stream(a)) for a in claimed}
    return RunStreams(run_id, run, tx.read_stream(steps_stream(run_id)), leases)


def reads(store):
    """(records read through the snapshot, records of a whole read, both folds)."""
    with store.session() as tx:
        resumed, whole = read_run_streams(tx, RUN), whole_streams(tx, RUN)
        return resumed.records_read(), whole.records_read(), resumed.fold(), whole.fold()


def store_document(store, document) -> None:
    with store.transaction() as tx:
        tx.execute(
            "UPDATE run_snapshots SET document = ? WHERE run_id = ?",
            (orjson.dumps(document, option=orjson.OPT_SORT_KEYS).decode(), RUN),
        )


def resealed(document):
    body = {key: value for key, value in document.items() if key != "digest"}
    digest = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {**body, "digest": "sha256:" + digest}


def test_a_long_run_loads_from_its_snapshot_and_verify_proves_it(rt):
    store = rt.store
    run_steps(rt, 100)
    run_version, steps_version, _ = snapshot_row(store)
    assert run_version >= 100 * 3 - SNAPSHOT_EVERY and steps_version > 0
    resumed, whole, from_snapshot, from_scratch = reads(store)
    assert from_snapshot == from_scratch
    assert resumed < whole / 4  # only the tail after the snapshot, not the whole history
    assert verify(store).ok

    rebuild(store)
    assert snapshot_row(store) is None and verify(store).ok
    run_steps(rt, STEPS - 100)
    rt.cycle(now_ms=T0 + 2)
    assert store.query("SELECT status FROM runs WHERE run_id = ?", (RUN,))[0][0] == "succeeded"
    assert snapshot_row(store) is None  # a Run's end drops its snapshot
    assert verify(store).ok


def test_a_tampered_snapshot_is_a_named_difference_and_never_decides(rt):
    store = rt.store
    run_steps(rt, 70)
    run_version, steps_version, text = snapshot_row(store)
    document = orjson.loads(text)
    key = {"run_id": RUN, "run_version": run_version, "steps_version": steps_version}

    # an edit that leaves the digest stale: the loader folds the whole log instead
    step = next(s for s in document["steps"] if s["status"] == "succeeded")
    step["status"] = "failed"
    store_document(store, document)
    resumed, whole, from_snapshot, from_scratch = reads(store)
    assert resumed == whole and from_snapshot == from_scratch
    report = verify(store)
    assert not report.ok
    [difference] = report.differences
    assert (difference.table, difference.key, difference.kind) == ("run_snapshots", key, SNAPSHOT)
    assert "does not decode" in difference.problem
    assert f"run_snapshots [run_id={RUN!r}, run_version={run_version}" in "\n".join(report.lines())

    # a forged digest passes the loader's checks; verify still names what differs
    store_document(store, resealed(document))
    [difference] = verify(store).differences
    assert difference.kind == SNAPSHOT and "differs from the fold of the log in steps" in (
        difference.problem
    )

    # a snapshot moved off the log (a version it was not folded at) is not used
    forged = resealed({**document, "run": {**document["run"], "head_event_id": "elsewhere"}})
    store_document(store, forged)
    resumed, whole, from_snapshot, from_scratch = reads(store)
    assert resumed == whole and from_snapshot == from_scratch
    assert not verify(store).ok

    rebuild(store)
    assert verify(store).ok
    run_steps(rt, STEPS - 70)
    rt.cycle(now_ms=T0 + 2)
    assert store.query("SELECT status FROM runs WHERE run_id = ?", (RUN,))[0][0] == "succeeded"
