"""What `why` answers, and how it reads: the Run's intent, the Attempts that hold
execution authority, the steps that wait, what the next cycle does, or — for a
terminal Run — its root cause."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Intent:
    """The Run's cancel intent: recorded (who, when) or implied by a passed deadline."""

    reason: str
    at_ms: int
    by: str | None  # the recording actor; None for a deadline not yet recorded
    recorded: bool


@dataclass(frozen=True, slots=True)
class AttemptBlock:
    """An Attempt that holds execution authority (or waits for a worker)."""

    attempt_id: str
    step_key: str
    attempt_number: int
    status: str  # claimed | starting | running
    lease_id: str | None
    lease_version: int | None
    lease_status: str | None  # leased | completed | released | None (never leased)
    worker_id: str | None
    expires_at_ms: int | None
    lease_live: bool
    next: str  # what happens next, in a sentence


@dataclass(frozen=True, slots=True)
class StepWait:
    """A non-terminal StepRun without an Attempt holding it, and what it waits for."""

    step_key: str
    status: str
    waiting_on: tuple[str, ...]  # needs that have not succeeded (pending steps)
    next: str


@dataclass(frozen=True, slots=True)
class RootCause:
    """Why a terminal Run ended as it did."""

    status: str
    kind: str  # step_failed | step_timed_out | step_cancelled | cancel_intent | succeeded
    position: int | None  # of the event that decided it
    at_ms: int | None
    step_key: str | None = None
    result_code: str | None = None
    attempt_id: str | None = None
    worker_id: str | None = None
    reason: str | None = None
    by: str | None = None
    skipped: tuple[str, ...] = ()  # descendants skipped because of the failed step
    ended_by_cancel: tuple[str, ...] = ()  # steps the cancellation ended
    other_failures: tuple[str, ...] = ()  # later non-successes of the same kind


@dataclass(frozen=True, slots=True)
class WhyReport:
    """Why the Run is not terminal yet — or, for a terminal Run, its root cause."""

    run_id: str
    status: str
    version: int
    now_ms: int
    deadline_ms: int | None
    deadline_passed: bool
    intent: Intent | None
    blocked: tuple[AttemptBlock, ...] = ()
    backlog: tuple[AttemptBlock, ...] = ()
    steps: tuple[StepWait, ...] = ()
    next_cycle: str | None = None
    root_cause: RootCause | None = None
    terminal_at_ms: int | None = None

    @property
    def terminal(self) -> bool:
        """Whether the Run has ended (the report then holds its root cause)."""
        return self.root_cause is not None

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON object."""
        return {**asdict(self), "terminal": self.terminal}

    def lines(self) -> list[str]:
        """The report as human sentences."""
        if self.root_cause is not None:
            return _root_cause_lines(self)
        lines = [f"run {self.run_id} is running at version {self.version} (as of {self.now_ms})"]
        if self.intent is not None:
            if self.intent.recorded:
                lines.append(
                    f"cancel intent: reason {self.intent.reason}, requested by "
                    f"{self.intent.by} at {self.intent.at_ms}"
                )
            else:
                lines.append(
                    f"its deadline {self.intent.at_ms} has passed: the next cycle records a "
                    "timeout cancel intent"
                )
        elif self.deadline_ms is not None:
            lines.append(
                f"deadline at {self.deadline_ms} ({self.deadline_ms - self.now_ms} ms left)"
            )
        for block in self.blocked:
            lines.append(
                f"blocked: attempt {block.attempt_id} (step {block.step_key!r}, "
                f"#{block.attempt_number}) is {block.status}; {block.next}"
            )
        for block in self.backlog:
            lines.append(
                f"backlog: attempt {block.attempt_id} (step {block.step_key!r}) is claimed "
                f"without a live lease; {block.next}"
            )
        for wait in self.steps:
            lines.append(f"step {wait.step_key!r} is {wait.status}; {wait.next}")
        if self.next_cycle:
            lines.append(self.next_cycle)
        return lines


def _root_cause_lines(report: WhyReport) -> list[str]:
    cause = report.root_cause
    assert cause is not None
    lines = [f"run {report.run_id} is {report.status} (terminal at {report.terminal_at_ms})"]
    if cause.kind == "succeeded":
        lines.append("every step succeeded")
    elif cause.kind == "cancel_intent":
        if cause.reason == "timeout":
            lines.append(
                f"its deadline {report.deadline_ms} passed: timeout intent recorded by "
                f"{cause.by} at {cause.at_ms} (position {cause.position})"
            )
        else:
            lines.append(
                f"cancelled by {cause.by} (reason {cause.reason}) at {cause.at_ms} "
                f"(position {cause.position})"
            )
        if cause.ended_by_cancel:
            lines.append(f"steps ended by the cancellation: {', '.join(cause.ended_by_cancel)}")
    else:
        worker = (
            f" (attempt {cause.attempt_id}, worker {cause.worker_id})" if cause.attempt_id else ""
        )
        lines.append(
            f"first cause: step {cause.step_key!r} {cause.kind.removeprefix('step_')} with "
            f"{cause.result_code} at {cause.at_ms} (position {cause.position}){worker}"
        )
        if cause.skipped:
            lines.append(f"skipped because of it: {', '.join(cause.skipped)}")
        if cause.other_failures:
            lines.append(f"later failures: {', '.join(cause.other_failures)}")
    return lines
