"""Many writers at once: nothing lost, nothing doubled, every loser told why — and, on
PostgreSQL, a tailing reader never skips an event that commits late (gap safety)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter

import psycopg
import pytest

from domain.errors import IdempotencyConflict, VersionConflict
from domain.records import NewEvent, StreamAppend
from eventstore import open_store

THREADS = 8
ATTEMPTS = 12
SHARED_STREAMS = ("run-0", "run-1", "run-2")


def run_threads(count: int, target) -> None:
    threads = [threading.Thread(target=target, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a writer thread hung"


def test_writers_on_overlapping_streams_lose_nothing_and_double_nothing(store_url):
    store = open_store(store_url)
    barrier = threading.Barrier(THREADS)
    won: list[StreamAppend] = []
    lost: list[StreamAppend] = []
    unexpected: list[BaseException] = []

    def writer(n: int) -> None:
        rng = random.Random(n)
        try:
            barrier.wait(timeout=30)
            # all at once onto one new stream: exactly one may create it
            race = [StreamAppend("run-race", 0, (NewEvent(f"race-{n}", "t", {"n": n}),))]
            attempt(race)
            for i in range(ATTEMPTS):
                chosen = rng.sample(SHARED_STREAMS, rng.choice([1, 2]))
                heads = store.stream_versions(chosen)
                appends = [
                    StreamAppend(
                        stream_id,
                        heads[stream_id],
                        tuple(
                            NewEvent(f"w{n}-{i}-{stream_id}-{k}", "t", {"writer": n})
                            for k in range(rng.randint(1, 3))
                        ),
                    )
                    for stream_id in chosen
                ]
                attempt(appends)
        except BaseException as exc:  # collected: a thread cannot fail the test itself
            unexpected.append(exc)

    def attempt(appends: list[StreamAppend]) -> None:
        try:
            store.append(appends)
            won.extend(appends)
        except VersionConflict:
            lost.extend(appends)

    try:
        run_threads(THREADS, writer)
        records = store.read_all()
        heads = store.stream_versions(["run-race", *SHARED_STREAMS])
    finally:
        store.close()

    assert unexpected == []
    assert sum(1 for a in won if a.stream_id == "run-race") == 1
    assert sum(1 for a in lost if a.stream_id == "run-race") == THREADS - 1
    stored_ids = [r.event_id for r in records]
    assert len(stored_ids) == len(set(stored_ids))  # nothing doubled
    assert set(stored_ids) == {e.event_id for a in won for e in a.events}  # nothing lost
    positions = [r.global_position for r in records]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for stream_id, head in heads.items():
        versions = [r.stream_version for r in records if r.stream_id == stream_id]
        assert versions == list(range(1, head + 1))


def test_one_event_id_raced_into_two_streams_is_stored_once(store_url):
    store = open_store(store_url)
    barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def writer(n: int) -> None:
        barrier.wait(timeout=30)
        try:
            store.append([StreamAppend(f"run-{n}", 0, (NewEvent("same-id", "t", {"n": n}),))])
            outcomes.append("ok")
        except BaseException as exc:
            outcomes.append(exc)

    try:
        run_threads(2, writer)
        records = store.read_all()
        heads = store.stream_versions(["run-0", "run-1"])
    finally:
        store.close()

    assert sorted(map(type, outcomes), key=str) == sorted([str, IdempotencyConflict], key=str)
    assert [r.event_id for r in records] == ["same-id"]
    assert sorted(heads.values()) == [0, 1]  # the loser's stream was not created


@pytest.mark.pg
@pytest.mark.parametrize("slow_streams", [1, 2], ids=["slow-one-stream", "slow-two-streams"])
def test_a_tailing_reader_never_skips_an_event_that_commits_late(pg_url, slow_streams):
    """One writer allocates positions and then holds its transaction open while others
    try to append; a reader tails read_all meanwhile. If positions were handed out
    outside commit order, the others would commit higher positions first, the reader
    would move past the slow writer's positions and never see its events."""
    fast_writers = 4
    tag = f"gap_{uuid.uuid4().hex[:12]}"
    url = f"{pg_url}&application_name={tag}"
    store = open_store(url, pool_max_size=fast_writers + 3)
    allocated, release, stop = threading.Event(), threading.Event(), threading.Event()
    finished = Counter()
    seen: list = []
    reader_passes = [0]
    errors: list[BaseException] = []

    def slow_writer() -> None:
        try:
            with store.transaction() as tx:
                tx.append(
                    [
                        StreamAppend(f"run-slow-{k}", 0, (NewEvent(f"slow-{k}", "t", {}),))
                        for k in range(slow_streams)
                    ]
                )
                allocated.set()
                assert release.wait(timeout=30)
        except BaseException as exc:
            errors.append(exc)
            allocated.set()

    def fast_writer(n: int) -> None:
        try:
            store.append([StreamAppend(f"run-fast-{n}", 0, (NewEvent(f"fast-{n}", "t", {}),))])
        except BaseException as exc:
            errors.append(exc)
        finally:
            finished[n] += 1

    def reader() -> None:
        last = 0
        try:
            while True:
                done = stop.is_set()
                for record in store.read_all(after_position=last):
                    seen.append(record)
                    last = record.global_position
                reader_passes[0] += 1
                if done:
                    return
                stop.wait(0.002)  # poll interval
        except BaseException as exc:
            errors.append(exc)

    reader_thread = threading.Thread(target=reader, daemon=True)
    slow = threading.Thread(target=slow_writer, daemon=True)
    reader_thread.start()
    slow.start()
    assert allocated.wait(timeout=30)
    fast = [
        threading.Thread(target=fast_writer, args=(n,), daemon=True) for n in range(fast_writers)
    ]
    for thread in fast:
        thread.start()

    # wait until every fast writer has either committed or is blocked on a lock
    with psycopg.connect(pg_url, autocommit=True) as probe:
        deadline = time.monotonic() + 30
        while True:
            [(blocked,)] = probe.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND wait_event_type = 'Lock'",
                (tag,),
            ).fetchall()
            if blocked + len(finished) >= fast_writers:
                break
            assert time.monotonic() < deadline, "fast writers neither finished nor blocked"
            stop.wait(0.005)
    mark = reader_passes[0]
    while reader_passes[0] < mark + 2:  # the reader has looked while the slow one is open
        assert time.monotonic() < deadline
        stop.wait(0.002)

    release.set()
    slow.join(timeout=30)
    for thread in fast:
        thread.join(timeout=30)
    stop.set()
    reader_thread.join(timeout=30)
    everything = store.read_all()
    store.close()

    assert errors == []
    assert len(everything) == slow_streams + fast_writers
    positions = [r.global_position for r in seen]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert [r.event_id for r in seen] == [r.event_id for r in everything]
