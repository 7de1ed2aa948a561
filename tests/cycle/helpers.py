"""Shared builders for cycle tests: manifests, and a scripted in-process worker."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

T0 = 1_700_000_000_000


def manifest(
    steps: Iterable[tuple[str, Iterable[str]]],
    *,
    package: str = "demo",
    workflow: str = "flow",
    timeout_ms: int | None = None,
    publisher: str = "acme",
) -> dict:
    """A manifest dict with one task per step key (so task refs name steps)."""
    steps = [(key, list(needs)) for key, needs in steps]
    workflow_table: dict = {
        "steps": [{"key": key, "task": key, "needs": needs} for key, needs in steps]
    }
    if timeout_ms is not None:
        workflow_table["timeout_ms"] = timeout_ms
    return {
        "package": {"name": package, "publisher": publisher},
        "tasks": {key: {"command": ["true"]} for key, _ in steps},
        "workflows": {workflow: workflow_table},
    }


def chain(n: int) -> list[tuple[str, list[str]]]:
    return [(f"s{i:03d}", [f"s{i - 1:03d}"] if i else []) for i in range(n)]


DIAMOND = [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])]


def fan_out(width: int) -> list[tuple[str, list[str]]]:
    return [("root", []), *((f"leaf{i:03d}", ["root"]) for i in range(width))]


def work(
    rt,
    now_ms: int,
    outcomes: Mapping[str, str] | None = None,
    *,
    worker_id: str = "w1",
    limit: int = 256,
) -> int:
    """Lease every claimable Attempt and finish it with its step's scripted outcome
    (default succeeded). Returns how many Attempts were completed."""
    outcomes = outcomes or {}
    leases = rt.lease_attempts(worker_id, limit=limit, now_ms=now_ms)
    for lease in leases:
        rt.mark_running(lease, now_ms=now_ms)
        rt.complete(lease, outcomes.get(lease.step_key, "succeeded"), now_ms=now_ms)
    return len(leases)


def drive(rt, now_ms: int, outcomes: Mapping[str, str] | None = None, max_rounds: int = 500):
    """Cycle and work until a round changes nothing; returns the final now_ms."""
    for _ in range(max_rounds):
        result = rt.cycle(now_ms=now_ms)
        done = work(rt, now_ms, outcomes)
        if not result.changed and not done:
            return now_ms
        now_ms += 10
    raise AssertionError("workflow did not settle")


def statuses(rt, run_id: str) -> dict[str, str]:
    return {key: step.status for key, step in rt.get_run(run_id).steps.items()}


def record_intent_only(rt, run_id: str, now_ms: int, reason: str = "user") -> None:
    """Record cancel intent without the convergence `cancel` carries (what a cancel
    that finds an Attempt's lock held writes): the cycle's cancellation phase then has
    the Run to converge."""
    from actors.run_writes import RunWrite, write_runs
    from domain.cancellation import request_cancel

    with rt.store.transaction() as tx:
        write = RunWrite(run_id, lambda aggregate: request_cancel(aggregate, reason, now_ms))
        write_runs(tx, [write], None, wait=True).written[0].result()
