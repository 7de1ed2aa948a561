"""Builders for the dashboard's tests: Runs in known states, with explicit times."""

from __future__ import annotations

import dataclasses
from typing import Any

from domain.admission import admission_records
from domain.plan import PLAN_SCHEMA, normalize, plan_digest, plan_to_dict, task_ref
from projections import registry
from tests.cycle.helpers import DIAMOND, T0, drive, manifest, work

HOSTILE = "<script>alert(1)</script>"
DIGEST = "sha256:" + "0" * 64

__all__ = ["DIAMOND", "HOSTILE", "T0", "drive", "forge_run", "manifest", "scenario", "work"]


def forge_run(rt, run_id: str, step_key: str, now_ms: int, admission_key: str) -> str:
    """Append a one-step Run whose step key no manifest could hold (keys are names).
    The store is the dashboard's input, whoever wrote it: what it shows must be safe."""
    plan = normalize(
        {
            "schema": PLAN_SCHEMA,
            "project": "forged",
            "package": "forged",
            "installation": "forged",
            "lock_digest": DIGEST,
            "generation": 1,
            "revision_id": "forged-rev",
            "revision_digest": DIGEST,
            "publication_id": "forged-pub",
            "publication_digest": DIGEST,
            "workflow_key": "flow",
            "workflow_digest": DIGEST,
            "run_id": run_id,
            "timeout_ms": None,
            "steps": [
                {
                    "key": "placeholder",
                    "step_run_id": f"{run_id}.s",
                    "task_id": "task",
                    "task_ref": task_ref("forged", 1, "task"),
                    "source_digest": DIGEST,
                    "needs": [],
                    "initial_status": "ready",
                }
            ],
        }
    )
    steps = tuple(dataclasses.replace(step, key=step_key) for step in plan.steps)
    forged = dataclasses.replace(plan, steps=steps)
    forged = dataclasses.replace(forged, plan_digest=plan_digest(plan_to_dict(forged)))
    decision = admission_records(forged, admission_key, now_ms)
    with rt.store.transaction() as tx:
        registry.commit(tx, decision.appends)
    return run_id


def scenario(rt) -> dict[str, Any]:
    """Four Runs, admitted one second apart, newest last:
    failed (b fails, d skipped), succeeded, running (a held by worker w-live),
    and a cancelled Run of a second package. "lease" is w-live's lease of step a."""
    rt.publish(manifest(DIAMOND), now_ms=T0)
    rt.publish(manifest([("load", [])], package="other", workflow="etl"), now_ms=T0)
    ids: dict[str, Any] = {}
    ids["failed"] = rt.start("demo", "flow", admission_key="failed-1", now_ms=T0).run_id
    drive(rt, T0, outcomes={"b": "failed"})
    ids["succeeded"] = rt.start("demo", "flow", admission_key="ok-1", now_ms=T0 + 1000).run_id
    drive(rt, T0 + 1000)
    ids["running"] = rt.start("demo", "flow", admission_key="live-1", now_ms=T0 + 2000).run_id
    rt.cycle(now_ms=T0 + 2000)
    (lease,) = rt.lease_attempts("w-live", ttl_ms=600_000, now_ms=T0 + 2000)
    ids["lease"] = rt.mark_running(lease, now_ms=T0 + 2001)
    ids["cancelled"] = rt.start("other", "etl", admission_key="gone-1", now_ms=T0 + 3000).run_id
    rt.cancel(ids["cancelled"], now_ms=T0 + 3001)
    rt.cycle(now_ms=T0 + 3002)
    return ids
