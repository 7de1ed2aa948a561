"""What `why` answers, and how it reads: the Run's intent, the Attempts that hold
execution authority, the steps that wait, what the next cycle does, or — for a
terminal Run — its root cause."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from domain.transitions import ATTEMPT_CLAIMED, LEASE_LEASED, Status

When = Callable[[int | None], str]
"""How a sentence writes an instant (epoch ms); `epoch` by default, a person's local
time with a relative hint in the command line."""


def epoch(ms: int | None) -> str:
    """An instant as epoch milliseconds (what `--json` keeps)."""
    return "-" if ms is None else str(ms)


@dataclass(frozen=True, slots=True)
class Intent:
    """The Run's cancel intent: recorded (who, when) or implied by a passed deadline."""

    reason: str
    at_ms: int
    by: str | None  # the recording actor; None for a deadline not yet recorded
    recorded: bool


INTERRUPTED_WORDS = "interrupted by a host shutdown, will run again"


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
    interrupted: bool = False  # the step's Attempt before it was stopped by its host
    # the start barrier plus its step's timeout (docs/DESIGN.md "Step timeouts")
    step_deadline_ms: int | None = None
    past_step_timeout: bool = False

    @property
    def interrupted_words(self) -> str:
        """ "interrupted by a host shutdown, will run again; " or ""."""
        return f"{INTERRUPTED_WORDS}; " if self.interrupted else ""


@dataclass(frozen=True, slots=True)
class StepWait:
    """A non-terminal StepRun without an Attempt holding it, and what it waits for."""

    step_key: str
    status: str
    waiting_on: tuple[str, ...]  # needs that have not succeeded (pending steps)
    next: str
    retry: int | None = None  # a ready step waiting for its retry: the next Attempt's number
    max_attempts: int | None = None  # ... of at most this many
    retry_at_ms: int | None = None  # ... claimed at or after this instant

    def retry_words(self, when: When = epoch) -> str:
        """ "retry 2 of 3 at <time>", or "" when the step waits for no retry."""
        if self.retry_at_ms is None:
            return ""
        return f"retry {self.retry} of {self.max_attempts} at {when(self.retry_at_ms)}"


@dataclass(frozen=True, slots=True)
class StepFailure:
    """A step that failed, timed out or lost its Attempt: which Attempt, with what
    result code, exit code or signal, when, and the last lines of its log."""

    step_key: str
    status: str  # the Attempt's end (failed | timed_out | lost), else the step's
    result_code: str | None
    position: int  # of the event that recorded it
    at_ms: int | None
    attempt_id: str | None = None
    attempt_number: int | None = None
    worker_id: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    last_lines: tuple[str, ...] = ()
    log_pruned_at_ms: int | None = None  # its log was pruned (docs/DESIGN.md "Retention")
    retry: int | None = None  # the failure was retried: the next Attempt's number,
    max_attempts: int | None = None  # of at most this many,
    retry_at_ms: int | None = None  # claimed at or after this instant


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
    failures: tuple[StepFailure, ...] = ()  # every failed, timed out or lost step so far
    rerun_of: str | None = None  # the Run this one reruns (docs/DESIGN.md, "Reruns")
    reused: tuple[tuple[str, str], ...] = ()  # (step key, the Run its output came from)

    @property
    def terminal(self) -> bool:
        """Whether the Run has ended (the report then holds its root cause)."""
        return self.root_cause is not None

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON object."""
        return {**asdict(self), "terminal": self.terminal}

    def lineage_lines(self) -> list[str]:
        """Which Run this one reruns and which steps it reused from where."""
        if self.rerun_of is None:
            return []
        origins: dict[str, list[str]] = {}
        for step_key, origin in self.reused:
            origins.setdefault(origin, []).append(step_key)
        reused = "; ".join(f"reused from run {run}: {', '.join(keys)}"
                           for run, keys in origins.items())  # fmt: skip
        return [f"a rerun of run {self.rerun_of}" + (f"; {reused}" if reused else "")]

    def lines(self, when: When = epoch) -> list[str]:
        """The report as human sentences, instants written by `when`."""
        if self.root_cause is not None:
            failures = failure_lines(self.failures, when, self.run_id)
            return [*_root_cause_lines(self, when), *self.lineage_lines(), *failures]
        lines = [
            f"run {self.run_id} is running at version {self.version} (as of {when(self.now_ms)})",
            *self.lineage_lines(),
        ]
        if self.intent is not None:
            if self.intent.recorded:
                lines.append(
                    f"cancel intent: reason {self.intent.reason}, requested by "
                    f"{self.intent.by} at {when(self.intent.at_ms)}"
                )
            else:
                lines.append(
                    f"its deadline {when(self.intent.at_ms)} has passed: the next cycle "
                    "records a timeout cancel intent"
                )
        elif self.deadline_ms is not None:
            # a human `when` says "in 1m05s" itself; epoch ms need the arithmetic
            left = f" ({self.deadline_ms - self.now_ms} ms left)" if when is epoch else ""
            lines.append(f"deadline at {when(self.deadline_ms)}{left}")
        for block in self.blocked:
            lines.append(
                f"blocked: attempt {block.attempt_id} (step {block.step_key!r}, "
                f"#{block.attempt_number}) is {block.status}; {block.interrupted_words}"
                f"{attempt_next(block, self.intent, when)}"
            )
        for block in self.backlog:
            lines.append(
                f"backlog: attempt {block.attempt_id} (step {block.step_key!r}) is claimed "
                f"without a live lease; {block.interrupted_words}"
                f"{attempt_next(block, self.intent, when)}"
            )
        for wait in self.steps:
            retry = f" (waiting: {wait.retry_words(when)})" if wait.retry_at_ms is not None else ""
            lines.append(f"step {wait.step_key!r} is {wait.status}{retry}; {wait.next}")
        if self.next_cycle:
            lines.append(self.next_cycle)
        return [*lines, *failure_lines(self.failures, when, self.run_id)]


def failure_lines(
    failures: tuple[StepFailure, ...], when: When = epoch, run_id: str = "RUN"
) -> list[str]:
    """One sentence per failed, timed out or lost step, each followed by the last lines
    of its log (indented)."""
    lines = []
    for failure in failures:
        how = {Status.LOST.value: "lost its Attempt"}.get(
            failure.status, failure.status.replace("_", " ")
        )
        details = [failure.result_code] if failure.result_code else []
        if failure.signal:
            details.append(f"ended by {failure.signal}")
        elif failure.exit_code is not None:
            details.append(f"exit {failure.exit_code}")
        attempt = (
            f", attempt #{failure.attempt_number} {failure.attempt_id}"
            if failure.attempt_id
            else ""
        )
        worker = f" on {failure.worker_id}" if failure.worker_id else ""
        said = f" ({', '.join(details)})" if details else ""
        retried = (
            f"; retry {failure.retry} of {failure.max_attempts} at {when(failure.retry_at_ms)}"
            if failure.retry_at_ms is not None
            else ""
        )
        lines.append(
            f"step {failure.step_key!r} {how}{said} at {when(failure.at_ms)}{attempt}{worker}"
            f"{retried}"
        )
        if failure.last_lines:
            lines.append(f"  last lines of its log (qlflow logs {run_id} {failure.step_key}):")
            lines += [f"  | {line}" for line in failure.last_lines]
        elif failure.log_pruned_at_ms is not None:
            lines.append(f"  its log was pruned by retention on {when(failure.log_pruned_at_ms)}")
        elif failure.attempt_id:
            lines.append("  its log is empty")
    return lines


def ending(intent: Intent | None) -> str:
    """How cancel intent ends what it stops: timed_out for a timeout, else cancelled."""
    return (
        Status.TIMED_OUT if intent is not None and intent.reason == "timeout" else Status.CANCELLED
    )


def attempt_next(block: AttemptBlock, intent: Intent | None, when: When = epoch) -> str:
    """What happens next to an Attempt that holds authority (or waits for a worker)."""
    lease_id, worker, expires = block.lease_id, block.worker_id, when(block.expires_at_ms)
    if block.status == ATTEMPT_CLAIMED:
        if block.lease_live:
            after = (
                f"cancellation then ends it as {ending(intent)}"
                if intent
                else "its step is requeued for a new Attempt"
            )
            return (
                f"worker {worker} holds lease {lease_id} v{block.lease_version} until "
                f"{expires}; if it expires before the worker starts, recovery marks "
                f"the Attempt lost and {after}"
            )
        if block.lease_status == LEASE_LEASED:
            return (
                f"lease {lease_id} of worker {worker} expired at {expires}: the next "
                "cycle's recovery marks the Attempt lost and "
                + (f"cancellation ends it as {ending(intent)}" if intent else "requeues its step")
                + ("" if intent else " (unless a worker leases it again first)")
            )
        if intent:
            return f"the next cycle's cancellation ends it as {ending(intent)}"
        return "it waits for a worker to lease it (lease_attempts)"
    after = (
        "its step is left lost and cancellation ends it as cancelled"
        if intent
        else "its step fails (lease_expired): it is never run twice"
    )
    if block.lease_live:
        return (
            f"worker {worker} holds lease {lease_id} v{block.lease_version} until {expires}; "
            "it ends when the worker completes"
            + (" (as " + ending(intent) + ": the Run has cancel intent)" if intent else "")
            + _step_timeout_words(block, when)
            + f"; if the lease expires first, recovery marks the Attempt lost and {after}"
        )
    gone = (
        f"lease {lease_id} of worker {worker} expired at {expires}"
        if lease_id is not None
        else "it has no lease"
    )
    return f"{gone}: the next cycle's recovery marks the Attempt lost and {after}"


def _step_timeout_words(block: AttemptBlock, when: When) -> str:
    """What the step's timeout does to a running Attempt, or "" when it has none."""
    if block.step_deadline_ms is None:
        return ""
    deadline = when(block.step_deadline_ms)
    if block.past_step_timeout:
        return (
            f"; it passed its step's timeout at {deadline}: its host stops it at the next "
            "renewal and records it timed_out (step_timeout)"
        )
    return f"; its step times out at {deadline} (then its host stops it)"


def _root_cause_lines(report: WhyReport, when: When) -> list[str]:
    cause = report.root_cause
    assert cause is not None
    lines = [f"run {report.run_id} is {report.status} (ended {when(report.terminal_at_ms)})"]
    if cause.kind == Status.SUCCEEDED:
        lines.append("every step succeeded")
    elif cause.kind == "cancel_intent":
        if cause.reason == "timeout":
            lines.append(
                f"its deadline {when(report.deadline_ms)} passed: timeout intent recorded by "
                f"{cause.by} at {when(cause.at_ms)} (position {cause.position})"
            )
        else:
            lines.append(
                f"cancelled by {cause.by} (reason {cause.reason}) at {when(cause.at_ms)} "
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
            f"{cause.result_code} at {when(cause.at_ms)} (position {cause.position}){worker}"
        )
        if cause.skipped:
            lines.append(f"skipped because of it: {', '.join(cause.skipped)}")
        if cause.other_failures:
            lines.append(f"later failures: {', '.join(cause.other_failures)}")
    return lines
