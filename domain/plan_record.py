"""The execution plan as a `workflow.admitted` record carries it, read back strictly:
a plan the log holds that does not check is a CorruptionError naming the record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.errors import CorruptionError, PlanError
from domain.flow import NO_FLOW, PlanFlow, plan_flow
from domain.graph import DependencyCycle, UnknownNeed, topological_order
from domain.notify import plan_notify
from domain.plan import ExecutionPlan, PlanStep
from domain.records import Record
from domain.transitions import Status


def _where(record: Record) -> str:
    return f"{record.stream_id} v{record.stream_version} ({record.event_id}, {record.type})"


def corrupt(record: Record, problem: str) -> CorruptionError:
    """The CorruptionError for `record` breaking an integrity rule: `problem`."""
    return CorruptionError(f"{_where(record)}: {problem}")


# --- plan ------------------------------------------------------------------------------

_PLAN_FIELDS = tuple(
    f for f in ExecutionPlan.__dataclass_fields__ if f not in ("steps", "params", "notify", "flow")
)


def plan_from_data(value: Any, record: Record) -> ExecutionPlan:
    """Read the admitted plan back without re-hashing it.

    Admission checked the plan strictly (`domain.plan.normalize`); a fold runs on
    every decision, so it only checks the shape and the step graph here.
    """
    if not isinstance(value, Mapping):
        raise corrupt(record, "the plan is not an object")
    try:
        steps = tuple(
            PlanStep(
                key=s["key"],
                step_run_id=s["step_run_id"],
                task_id=s["task_id"],
                task_ref=s["task_ref"],
                source_digest=s["source_digest"],
                needs=tuple(s["needs"]),
                initial_status=s["initial_status"],
                timeout_ms=s.get("timeout_ms"),
                **_retry_of(s),
            )
            for s in value["steps"]
        )
        params = tuple(sorted(value.get("params", {}).items()))
        notify = plan_notify(value["notify"]) if "notify" in value else ()
        flow = _flow_of(value, tuple(s.key for s in steps))
        plan = ExecutionPlan(
            **{f: value[f] for f in _PLAN_FIELDS},
            steps=steps,
            params=params,
            notify=notify,
            flow=flow,
        )
    except (KeyError, TypeError) as error:
        raise corrupt(record, f"the plan is missing a field: {error!r}") from None
    except PlanError as error:
        raise corrupt(record, f"the plan's notify or flow is invalid: {error}") from None
    if not steps:
        raise corrupt(record, "the plan has no Steps")
    if not isinstance(plan.run_id, str) or not isinstance(plan.plan_digest, str):
        raise corrupt(record, "the plan's run_id or plan_digest is not a string")
    if plan.timeout_ms is not None and (not is_int(plan.timeout_ms) or plan.timeout_ms <= 0):
        raise corrupt(record, f"the plan's timeout_ms {plan.timeout_ms!r} is invalid")
    keys = [s.key for s in steps]
    if len(set(keys)) != len(keys) or len({s.step_run_id for s in steps}) != len(steps):
        raise corrupt(record, "the plan repeats a step key or a StepRun id")
    for step in steps:
        if step.timeout_ms is not None and (not is_int(step.timeout_ms) or step.timeout_ms <= 0):
            raise corrupt(record, f"plan step {step.key!r} has an invalid timeout_ms")
        expected = Status.PENDING if step.needs else Status.READY
        if step.initial_status != expected:
            raise corrupt(record, f"plan step {step.key!r} must start {expected!r}")
    return plan


def _flow_of(value: Mapping[str, Any], step_keys: tuple[str, ...]) -> PlanFlow:
    return plan_flow(value["flow"], step_keys) if "flow" in value else NO_FLOW


def flow_from_data(value: Any, record: Record) -> PlanFlow:
    """What the admitted plan binds of flow control, read back alone (as
    `plan_from_data` reads it, without the rest of the plan)."""
    try:
        return _flow_of(value, tuple(step["key"] for step in value["steps"]))
    except (KeyError, TypeError) as error:
        raise corrupt(record, f"the plan is missing a field: {error!r}") from None
    except PlanError as error:
        raise corrupt(record, f"the plan's notify or flow is invalid: {error}") from None


def _retry_of(step: Mapping[str, Any]) -> dict[str, int]:
    retry = step.get("retry")
    if retry is None:
        return {}
    return {"max_attempts": retry["max_attempts"], "backoff_ms": retry["backoff_ms"]}


def plan_order(plan: ExecutionPlan, record: Record) -> tuple[str, ...]:
    """Step keys with every need first; ties broken by key, so the order is stable."""
    try:
        return topological_order({step.key: step.needs for step in plan.steps})
    except UnknownNeed as problem:
        need = problem.unknown[0]
        raise corrupt(record, f"plan step {problem.step!r} needs unknown step {need!r}") from None
    except DependencyCycle:
        raise corrupt(record, "the plan's step graph has a cycle") from None


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)
