"""Workloads for the projection tests: a seeded random mix of Runs driven through the
public API (`qlflow.open(url)`: publish, start, cycle, lease_attempts, mark_running,
renew, complete, cancel) with explicit `now_ms`."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

T0 = 1_700_000_000_000
TTL_MS = 5_000

SHAPES: dict[str, list[tuple[str, list[str]]]] = {
    "one": [("a", [])],
    "chain": [("a", []), ("b", ["a"]), ("c", ["b"])],
    "diamond": [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])],
    "skips": [
        ("a", []),
        ("b", ["a"]),
        ("c", ["a"]),
        ("d", ["b", "c"]),
        ("e", ["d"]),
        ("f", []),
    ],
}


def manifest(
    steps: Iterable[tuple[str, Iterable[str]]], *, workflow: str, timeout_ms: int | None = None
) -> dict:
    """A manifest dict with one task per step key."""
    steps = [(key, list(needs)) for key, needs in steps]
    table: dict = {"steps": [{"key": k, "task": k, "needs": n} for k, n in steps]}
    if timeout_ms is not None:
        table["timeout_ms"] = timeout_ms
    return {
        "package": {"name": "demo", "publisher": "acme"},
        "tasks": {key: {"command": ["true"]} for key, _ in steps},
        "workflows": {workflow: table},
    }


def all_shapes_manifest() -> dict:
    """One package with a Workflow per shape (and a timed one per shape)."""
    document = manifest(SHAPES["skips"], workflow="skips")
    for name, steps in SHAPES.items():
        document["workflows"][name] = manifest(steps, workflow=name)["workflows"][name]
        timed = manifest(steps, workflow=name, timeout_ms=3_000)["workflows"][name]
        document["workflows"][f"{name}-timed"] = timed
    return document


@dataclass
class Fate:
    """What the random workload does to one Run."""

    fail_step: str | None = None
    cancel_at: int | None = None  # tick at which a worker's Run is cancelled
    stall_step: str | None = None  # its first lease is never started (expires)


def random_workload(api, seed: int, runs: int = 24, ticks: int = 40) -> list[str]:
    """Publish, start `runs` Runs of random shapes with random fates, and drive cycles
    and a worker for `ticks` ticks of 1 s. Returns the run ids (some may still be
    running at the end, holding leases or waiting on a stalled Attempt)."""
    rng = random.Random(seed)
    api.publish(all_shapes_manifest(), now_ms=T0)
    fates: dict[str, Fate] = {}
    now = T0
    started = 0
    stalled: set[str] = set()
    for tick in range(ticks):
        now = T0 + (tick + 1) * 1_000
        while started < runs and rng.random() < 0.6:
            started += 1
            shape = rng.choice(list(SHAPES))
            workflow = shape + ("-timed" if rng.random() < 0.15 else "")
            receipt = api.start(
                "demo",
                workflow,
                admission_key=f"key-{seed}-{started}",
                run_id=f"r{seed}-{started:03d}",
                now_ms=now,
            )
            keys = [k for k, _ in SHAPES[shape]]
            roll = rng.random()
            fate = Fate()
            if roll < 0.2:
                fate.fail_step = rng.choice(keys)
            elif roll < 0.35:
                fate.cancel_at = tick + rng.randint(0, 3)
            elif roll < 0.5:
                fate.stall_step = rng.choice(keys)
            fates[receipt.run_id] = fate
        api.cycle(now_ms=now)
        for lease in api.lease_attempts("w1", limit=64, ttl_ms=TTL_MS, now_ms=now):
            fate = fates[lease.run_id]
            if lease.step_key == fate.stall_step and lease.attempt_id not in stalled:
                stalled.add(lease.attempt_id)  # the worker vanishes before starting
                continue
            slow = rng.random()
            if slow < 0.05:
                continue  # a slow worker: it holds the lease without starting
            lease = api.mark_running(lease, now_ms=now)
            if slow < 0.1:
                continue  # it started and then vanished: recovery marks the step lost, failed
            if fate.cancel_at is not None and tick >= fate.cancel_at:
                api.cancel(lease.run_id, now_ms=now)
            lease = api.renew(lease, ttl_ms=TTL_MS, now_ms=now)
            outcome = "failed" if lease.step_key == fate.fail_step else "succeeded"
            api.complete(lease, outcome, now_ms=now, output={"tick": tick})
    return list(fates)
