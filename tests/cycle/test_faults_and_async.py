"""Lost COMMIT responses inside a cycle, and the async facade's event loop."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import qlflow
from eventstore import faults
from tests.cycle.helpers import DIAMOND, T0, drive, fan_out, manifest, record_intent_only


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()
    faults.disarm()


def all_event_ids(rt) -> list[str]:
    return [record.event_id for record in rt.store.iter_all(0)]


@pytest.mark.parametrize("phase", ["frontier", "claim", "cancellation"])
def test_lost_commit_response_in_a_cycle_is_replayed_exactly(rt, phase):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    at, expected = T0 + 1, {"cancellation": "cancelled", "frontier": "failed"}
    if phase == "frontier":
        # a completion carries its frontier; a lease that expires after the start leaves
        # it to the cycle: recovery fails a (lease_expired), the frontier skips the rest
        rt.lease_attempts("w1", ttl_ms=5_000, now_ms=T0, start=True)
        at = T0 + 5_000
    if phase == "claim":
        # the start claims the root; a lease that expires before its start leaves the
        # next claim to the cycle: recovery requeues a, attempt admission claims again
        rt.lease_attempts("w1", ttl_ms=5_000, now_ms=T0)
        at = T0 + 5_000
    if phase == "cancellation":
        record_intent_only(rt, run_id, T0)
    before = rt.store.head_position()
    faults.arm(f"{phase}.after_commit", "raise")
    first = rt.cycle(now_ms=at)
    errors = getattr(first, phase).errors
    assert len(errors) == 1 and "injected fault" in errors[0]
    assert rt.store.head_position() > before, "the commit itself went through"
    drive(rt, at + 1)
    ids = all_event_ids(rt)
    assert len(ids) == len(set(ids)), "no event id twice"
    run = rt.get_run(run_id)
    assert run.status == expected.get(phase, "succeeded")
    per_step = Counter(a.status for step in run.steps.values() for a in step.attempts)
    assert per_step.get("claimed", 0) == 0


def test_every_stream_stays_contiguous_after_a_busy_workload(rt):
    rt.publish(manifest(fan_out(20)), now_ms=T0)
    runs = [rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0).run_id for i in range(6)]
    rt.cancel(runs[0], now_ms=T0)
    drive(rt, T0 + 1, outcomes={"leaf003": "failed"})
    versions: dict[str, list[int]] = {}
    for record in rt.store.iter_all(0):
        versions.setdefault(record.stream_id, []).append(record.stream_version)
    for stream, got in versions.items():
        assert got == list(range(1, len(got) + 1)), stream
    assert {rt.get_run(r).status for r in runs[1:]} == {"failed"}
    assert rt.get_run(runs[0]).status == "cancelled"


async def test_async_cycle_does_not_block_the_event_loop(store_url):
    rt = await qlflow.open_async(store_url)
    try:
        await rt.publish(manifest(fan_out(60)), now_ms=T0)
        for i in range(8):
            await rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0)
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        leases = await rt.lease_attempts("w", limit=8, now_ms=T0)  # the roots
        for lease in leases:
            await rt.mark_running(lease, now_ms=T0)
        assert len(leases) == 8
        task = asyncio.create_task(ticker())
        result = await rt.cycle(now_ms=T0 + 60_000)  # every lease expired: recover 8 Runs
        stop.set()
        await task
        assert result.recovery.scanned == 8
        assert ticks > 1, "the loop kept running other tasks during the cycle"
    finally:
        await rt.close()
