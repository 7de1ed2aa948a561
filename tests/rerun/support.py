"""A small diamond Workflow and a driver that runs it to an end, for rerun tests."""

from __future__ import annotations

T0 = 1_800_000_000_000


def manifest(*, fetch_command: str = "true", extra_step: bool = False) -> dict:
    """fetch -> (left, right) -> join; `fetch_command` changes fetch's source digest."""
    steps = [
        {"key": "fetch", "task": "fetch"},
        {"key": "left", "task": "work", "needs": ["fetch"]},
        {"key": "right", "task": "work", "needs": ["fetch"]},
        {"key": "join", "task": "work", "needs": ["left", "right"]},
    ]
    if extra_step:
        steps.append({"key": "report", "task": "work", "needs": ["join"]})
    return {
        "package": {"name": "daily", "publisher": "acme"},
        "tasks": {"fetch": {"command": [fetch_command]}, "work": {"command": ["true"]}},
        "workflows": {
            "nightly": {
                "params": {"day": {"type": "string", "default": "mon"}},
                "steps": steps,
            }
        },
    }


def drive(rt, run_id: str, now_ms: int, fail: frozenset[str] = frozenset()) -> list[str]:
    """Run `run_id` until nothing is left to lease: every step succeeds with output
    {"step": key} except those in `fail`. Returns the steps that ran, in order."""
    ran: list[str] = []
    for _ in range(50):
        rt.cycle(now_ms=now_ms)
        leases = rt.lease_attempts("w1", limit=10, now_ms=now_ms, run_id=run_id)
        if not leases:
            rt.cycle(now_ms=now_ms)
            return ran
        for lease in leases:
            lease = rt.mark_running(lease, now_ms=now_ms)
            ran.append(lease.step_key)
            if lease.step_key in fail:
                rt.complete(lease, "failed", result_code="boom", now_ms=now_ms)
            else:
                rt.complete(lease, "succeeded", output={"step": lease.step_key}, now_ms=now_ms)
    raise AssertionError("the Run did not settle")


def failed_run(rt, fail: frozenset[str] = frozenset({"right"})) -> str:
    """A published diamond whose `fail` steps failed (their dependents skipped)."""
    rt.publish(manifest(), now_ms=T0)
    run_id = rt.start("daily", "nightly", admission_key="first", now_ms=T0).run_id
    drive(rt, run_id, T0, fail)
    assert rt.get_run(run_id).status == "failed"
    return run_id
