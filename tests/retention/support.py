"""Finished Runs of the rerun tests' diamond Workflow, for retention tests."""

from __future__ import annotations

from tests.rerun.support import T0, drive, manifest

DAY = 86_400_000


def finished_runs(rt, count: int, *, spacing_ms: int = 1000, fail: frozenset[str] = frozenset()):
    """Publish the diamond and run `count` Runs to their end, one every `spacing_ms`
    from T0; their run ids, oldest first."""
    rt.publish(manifest(), now_ms=T0)
    run_ids = []
    for n in range(count):
        at = T0 + n * spacing_ms
        run_id = rt.start("daily", "nightly", admission_key=f"key-{n}", now_ms=at).run_id
        drive(rt, run_id, at, fail)
        run_ids.append(run_id)
    return run_ids


def event_count(rt) -> int:
    return rt.store.query("SELECT COUNT(*) FROM events")[0][0]
