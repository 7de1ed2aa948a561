"""Cluster profile: several replica processes cycling and several worker processes
on one PostgreSQL, with random DAGs, cancels and timeouts (SPEC §8)."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import defaultdict

import pytest

import qlflow
from qlflow.errors import FenceError

RUNS = 200
REPLICAS = 4
WORKERS = 4
DEADLINE_S = 240


def random_dag(rng: random.Random) -> list[tuple[str, list[str]]]:
    size = rng.randint(1, 8)
    steps = []
    for i in range(size):
        earlier = [key for key, _ in steps]
        needs = rng.sample(earlier, k=min(len(earlier), rng.randint(0, 2)))
        steps.append((f"s{i}", sorted(needs)))
    return steps


def replica(url: str, stop) -> None:
    rt = qlflow.open(url)
    try:
        while not stop.is_set():
            rt.cycle()
    finally:
        rt.close()


def worker(url: str, name: str, stop, seed: int) -> None:
    rng = random.Random(seed)
    rt = qlflow.open(url)
    try:
        while not stop.is_set():
            for lease in rt.lease_attempts(name, limit=4, ttl_ms=30_000):
                try:
                    rt.mark_running(lease)
                    outcome = "failed" if rng.random() < 0.1 else "succeeded"
                    rt.complete(lease, outcome)
                except FenceError:
                    continue  # the lease was lost (expired or the Run moved on)
    finally:
        rt.close()


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_S + 180)  # its own deadline, then the report and the teardown
def test_replicas_and_workers_converge_every_run(pg_url):
    from tests.cycle.helpers import manifest

    rng = random.Random(7)
    rt = qlflow.open(pg_url)
    run_ids = []
    for i in range(RUNS):
        package = f"p{i % 20}"
        steps = random_dag(rng)
        timeout = 1_500 if rng.random() < 0.1 else None
        rt.publish(manifest(steps, package=package, workflow=f"w{i}", timeout_ms=timeout))
        run_ids.append(rt.start(package, f"w{i}", admission_key=f"run-{i}").run_id)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=replica, args=(pg_url, stop)) for _ in range(REPLICAS)]
    procs += [ctx.Process(target=worker, args=(pg_url, f"w{i}", stop, i)) for i in range(WORKERS)]
    for proc in procs:
        proc.start()
    try:
        for run_id in rng.sample(run_ids, 30):
            rt.cancel(run_id)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            open_runs = rt.store.query("SELECT count(*) FROM runs WHERE status = 'running'")
            if open_runs[0][0] == 0:
                break
            stop.wait(0.2)
    finally:
        stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    assert all(proc.exitcode == 0 for proc in procs)
    statuses = {rt.get_run(r).status for r in run_ids}
    assert "running" not in statuses

    records = list(rt.store.iter_all(0))
    ids = [r.event_id for r in records]
    assert len(ids) == len(set(ids)), "duplicate event id"
    versions = defaultdict(list)
    for r in records:
        versions[r.stream_id].append(r.stream_version)
    for stream, got in versions.items():
        assert got == list(range(1, len(got) + 1)), f"{stream} not contiguous"
    lease_end: dict[str, int] = {}
    lease_start: dict[str, int] = {}
    for r in records:
        if r.type == "lease.granted":
            lease_start[r.data["lease_id"]] = r.global_position
        # a lease completes in the commit of its Attempt's end, which a completion may
        # share with the Run's terminal: the Attempt's end is where the lease stopped
        ended = r.type in ("lease.completed", "lease.released") or (
            r.type.startswith("attempt.") and "result_code" in r.data
        )
        if ended and r.data.get("lease_id"):
            lease_id = r.data["lease_id"]
            lease_end[lease_id] = min(lease_end.get(lease_id, 10**18), r.global_position)
    for run_id in run_ids:
        run_records = [r for r in records if r.stream_id == f"run-{run_id}"]
        assert run_records[-1].type.startswith("workflow.")
        terminal = run_records[-1].global_position
        started_per_step = defaultdict(int)
        attempt_step = {}
        for r in run_records:
            if r.type == "attempt.claimed":
                attempt_step[r.data["attempt_id"]] = r.data["step_key"]
            if r.type == "attempt.starting":
                started_per_step[attempt_step[r.data["attempt_id"]]] += 1
                lease_id = r.data["lease_id"]
                assert lease_end.get(lease_id, 10**18) < terminal, "run ended under a live lease"
        assert all(n <= 1 for n in started_per_step.values()), "a step started twice"
    rt.close()
