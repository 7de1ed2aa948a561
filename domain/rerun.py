"""Which steps a rerun reuses (docs/DESIGN.md, "Reruns").

A rerun admits a new Run from a finished one. A step that succeeded in the source
Run and is neither one of `from_steps` nor downstream of one is reused: the new Run
records it as succeeded with the source Attempt's output (`step.reused`), so its
dependents see the same inputs. Every other step runs. Without `from_steps`, the
steps that did not succeed and everything downstream of them run again.

With the package's current head (`plan="head"`) a reused step must exist in the new
plan with the same Task source digest and the same needs; the steps that differ are
refused together (`RerunRefused.steps`), so the caller can name them in `from_steps`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain.errors import InvalidInput
from domain.plan import ExecutionPlan
from domain.run_state import RunAggregate
from domain.transitions import ATTEMPT_SUCCEEDED, STEP_SUCCEEDED, Status

PLAN_SAME = "same"
PLAN_HEAD = "head"
PLAN_MODES = (PLAN_SAME, PLAN_HEAD)


class RerunRefused(InvalidInput):
    """A rerun that cannot be admitted as asked; `steps` lists the steps at fault."""

    def __init__(self, rule: str, message: str, steps: Sequence[str] = ()) -> None:
        super().__init__("from_steps", rule, message)
        self.steps = tuple(steps)


@dataclass(frozen=True, slots=True)
class Reuse:
    """One reused step: the source Run, the Attempt whose output it reuses, the output."""

    step_key: str
    run_id: str
    attempt_id: str
    output: Mapping[str, Any] | None


def check_mode(plan: object) -> str:
    """`plan` as given, when it is one of PLAN_MODES."""
    if plan not in PLAN_MODES:
        raise InvalidInput("plan", "mode", f"plan must be one of {PLAN_MODES}, got {plan!r}")
    return str(plan)


def check_rerunnable(source: RunAggregate) -> None:
    """A Run that is still running cannot be rerun."""
    if not source.run.is_terminal:
        raise RerunRefused(
            Status.RUNNING,
            f"run {source.run_id!r} is still {source.run.status}; wait for it to finish "
            "or cancel it before rerunning it",
        )


def is_rerun_of(rerun_of: Mapping[str, Any] | None, source_run_id: str, mode: str) -> bool:
    """Whether a Run whose `workflow.admitted` names `rerun_of` is a rerun of
    `source_run_id` in plan `mode`: what a rerun under a taken admission key is
    compared with once retention removed its source and no plan can be made again
    (docs/DESIGN.md "Retention")."""
    if not isinstance(rerun_of, Mapping):
        return False
    return rerun_of.get("run_id") == source_run_id and rerun_of.get("plan", PLAN_SAME) == mode


def runs_again_by_default(status: str) -> bool:
    """Whether a finished step with `status` runs again in a rerun without
    `from_steps` (it did not succeed); for a Run, whether such a rerun has work."""
    return status != STEP_SUCCEEDED


def rerun_steps(source: RunAggregate, from_steps: Iterable[str] | None) -> frozenset[str]:
    """The steps of the source Run that run again: `from_steps` (default: every step
    that did not succeed) and everything downstream of them."""
    steps = source.steps
    if from_steps is None:
        seeds = {key for key, step in steps.items() if runs_again_by_default(step.status)}
    else:
        if isinstance(from_steps, str):
            raise InvalidInput("from_steps", "type", "from_steps must be a list of step keys")
        seeds = set(from_steps)
        unknown = sorted(key for key in seeds if key not in steps)
        if unknown:
            raise RerunRefused(
                "unknown_step",
                f"run {source.run_id!r} ({source.plan.workflow_key}) has no step "
                f"{', '.join(map(repr, unknown))}; its steps are {', '.join(sorted(steps))}",
                unknown,
            )
    if not seeds:
        raise RerunRefused(
            "nothing_to_rerun",
            f"every step of run {source.run_id!r} succeeded; name the steps to run again "
            "with from_steps (--from)",
        )
    dependents: dict[str, list[str]] = {key: [] for key in steps}
    for key, step in steps.items():
        for need in step.needs:
            dependents[need].append(key)
    chosen: set[str] = set()
    todo = list(seeds)
    while todo:
        key = todo.pop()
        if key not in chosen:
            chosen.add(key)
            todo.extend(dependents[key])
    return frozenset(chosen)


def reused_steps(
    source: RunAggregate, plan: ExecutionPlan, from_steps: Iterable[str] | None
) -> tuple[Reuse, ...]:
    """The steps of `plan` (the new Run's) reused from `source`, in key order.

    Raises RerunRefused: the source still runs, a step of `from_steps` is unknown,
    nothing would run, or (another plan) a reused step differs in the new plan.
    """
    check_rerunnable(source)
    again = rerun_steps(source, from_steps)
    planned = {step.key: step for step in plan.steps}
    reuses: list[Reuse] = []
    differ: list[str] = []
    for key, step in sorted(source.steps.items()):
        if key in again or step.status != STEP_SUCCEEDED:
            continue  # it runs
        new = planned.get(key)
        if new is None or new.source_digest != step.source_digest or new.needs != step.needs:
            differ.append(key)
            continue
        reuses.append(_origin(source, key))
    if differ:
        raise RerunRefused(
            "plan_differs",
            f"steps {', '.join(differ)} would be reused from run {source.run_id!r}, but the "
            "new plan lacks them or changed their Task source or needs; rerun them too "
            f"(--from {' --from '.join(differ)})",
            differ,
        )
    return tuple(reuses)


def _origin(source: RunAggregate, key: str) -> Reuse:
    """Where the succeeded output of step `key` of `source` comes from: its succeeded
    Attempt, or (a step the source reused itself) the Run and Attempt it reused."""
    step = source.steps[key]
    if step.reused_from is not None:
        origin = step.reused_from
        return Reuse(key, origin["run_id"], origin["attempt_id"], origin["output"])
    attempt_id = next(
        a for a in reversed(step.attempt_ids) if source.attempts[a].status == ATTEMPT_SUCCEEDED
    )
    return Reuse(key, source.run_id, attempt_id, source.attempts[attempt_id].output)
