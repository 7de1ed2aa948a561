"""Audit queries over the event log (SPEC §9): a Run's timeline, a Step's history,
the aggregate at any version, why a Run is (not) terminal, and a tail of new events.

Everything here reads the log, never the read models, and folds with the domain's
own `fold`, so an answer can be checked against the records it cites. Reads take
the store's head position first and ignore anything after it: positions are
assigned in commit order (both adapters), so the streams read one by one still form
one consistent state — the log as it was at that position.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from domain.aggregate import (
    AttemptState,
    RunAggregate,
    effective_intent,
    fold,
    lease_stream,
    run_stream,
    steps_stream,
)
from domain.errors import InvalidInput, NotFound
from domain.frontier import aggregate_outcome
from domain.records import Record
from domain.transitions import (
    ATTEMPT_CLAIMED,
    LEASE_LEASED,
    STEP_LOST,
    STEP_PENDING,
    STEP_READY,
    STEP_RUNNING,
    STEP_TERMINAL,
    STEP_WAITING_APPROVAL,
)

# --- reading a Run's streams -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunLog:
    """A Run's records up to `position`: run and steps streams, and each Attempt's lease
    stream (attempts in claim order)."""

    run_id: str
    position: int
    run: tuple[Record, ...]
    steps: tuple[Record, ...]
    leases: Mapping[str, tuple[Record, ...]]

    def merged(self) -> list[Record]:
        """Every record of the Run, in global position order."""
        records = [*self.run, *self.steps, *(r for rs in self.leases.values() for r in rs)]
        return sorted(records, key=lambda r: r.global_position)


def read_run_log(store, run_id: str) -> RunLog:
    """The Run's streams as of the current head (NotFound if the Run does not exist)."""
    if not isinstance(run_id, str) or not run_id:
        raise InvalidInput(
            "run_id", "non-empty string", f"run_id must be a non-empty string, got {run_id!r}"
        )
    head = store.head_position()

    def upto(records: Sequence[Record]) -> tuple[Record, ...]:
        return tuple(r for r in records if r.global_position <= head)

    run = upto(store.read_stream(run_stream(run_id)))
    if not run:
        raise NotFound(f"run {run_id!r} does not exist; `qlflow runs` lists the runs")
    attempts = [r.data["attempt_id"] for r in run if r.type == "attempt.claimed"]
    return RunLog(
        run_id=run_id,
        position=head,
        run=run,
        steps=upto(store.read_stream(steps_stream(run_id))),
        leases={a: upto(store.read_stream(lease_stream(a))) for a in attempts},
    )


# --- timeline and step history ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One record of a Run, made readable."""

    position: int
    stream_id: str
    version: int
    at_ms: int | None
    type: str
    actor: str | None
    step_key: str | None
    attempt_id: str | None
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timeline(store, run_id: str, *, mutations: bool = True) -> list[TimelineEntry]:
    """Every record of the Run (run, steps and lease streams) in position order.
    `mutations=False` leaves out the StepRunMutations, which repeat their step.* event."""
    log = read_run_log(store, run_id)
    return _entries(log, mutations=mutations)


def step_history(store, run_id: str, step_key: str) -> list[TimelineEntry]:
    """The records about one Step: its StepRun's changes and mutations, its Attempts
    and their leases, in position order."""
    log = read_run_log(store, run_id)
    plan_keys = {s["key"] for s in log.run[0].data["plan"]["steps"]}
    if step_key not in plan_keys:
        raise NotFound(
            f"run {run_id!r} has no step {step_key!r}; its steps are {sorted(plan_keys)}"
        )
    return [e for e in _entries(log, mutations=True) if e.step_key == step_key]


def _entries(log: RunLog, *, mutations: bool) -> list[TimelineEntry]:
    step_of_attempt: dict[str, str] = {}
    for record in log.run:
        if record.type == "attempt.claimed":
            step_of_attempt[record.data["attempt_id"]] = record.data["step_key"]
    entries = []
    for record in log.merged():
        if not mutations and record.stream_id.startswith("steps-"):
            continue
        data = record.data
        attempt_id = data.get("attempt_id")
        if record.stream_id.startswith("lease-"):
            attempt_id = record.stream_id[len("lease-") :]
        step_key = data.get("step_key") or step_of_attempt.get(attempt_id or "")
        entries.append(
            TimelineEntry(
                position=record.global_position,
                stream_id=record.stream_id,
                version=record.stream_version,
                at_ms=record.metadata.get("at_ms"),
                type=record.type,
                actor=record.metadata.get("actor"),
                step_key=step_key,
                attempt_id=attempt_id,
                summary=summarize(record, step_key),
            )
        )
    return entries


def summarize(record: Record, step_key: str | None = None) -> str:
    """One readable sentence about a record of a Run's streams."""
    data = record.data
    kind = record.type
    head, _, tail = kind.partition(".")
    step = f"step {step_key or data.get('step_key')!r}"
    if kind == "workflow.admitted":
        plan = data["plan"]
        timeout = plan.get("timeout_ms")
        limit = f", timeout {timeout} ms" if timeout is not None else ""
        return (
            f"admitted {plan['package']}/{plan['workflow_key']} generation {plan['generation']} "
            f"with {len(plan['steps'])} steps{limit} (key {data.get('admission_key')!r})"
        )
    if kind == "workflow.cancel_requested":
        actor = record.metadata.get("actor")
        return f"cancel requested: reason {data['reason']} by {actor} at {data['requested_at_ms']}"
    if head == "workflow":
        code = (
            f" ({data.get('result_code')}, {data.get('error_code')})" if tail != "succeeded" else ""
        )
        return f"run {tail}{code}"
    if kind == "step.created":
        return f"{step} created {data['status']}"
    if head == "step":
        code = f" [{data['result_code']}]" if data.get("result_code") else ""
        return f"{step}: {data['from']} -> {data['to']} (epoch {data['epoch']}){code}"
    if kind == "attempt.claimed":
        return (
            f"attempt #{data['attempt_number']} of {step} claimed ({data['attempt_id']}) "
            f"against epoch {data['step_epoch']}"
        )
    if kind in ("attempt.starting", "attempt.running"):
        return (
            f"attempt {data['attempt_id']} {tail} by worker {data.get('worker_id')} "
            f"under lease {data['lease_id']} v{data['lease_version']}"
        )
    if head == "attempt":
        reported = data.get("reported_outcome")
        said = f", worker reported {reported}" if reported and reported != tail else ""
        code = f" [{data['result_code']}]" if data.get("result_code") else ""
        return f"attempt {data['attempt_id']} {tail}{code}{said}"
    if kind == "step_run.mutated":
        return (
            f"mutation: {step} {data['from']} -> {data['to']} (epoch {data['step_epoch']}, "
            f"run v{data['run_version']})"
        )
    if kind == "lease.granted":
        return (
            f"lease {data['lease_id']} granted to worker {data['worker_id']} "
            f"until {data['expires_at_ms']} (ttl {data['ttl_ms']} ms)"
        )
    if kind == "lease.renewed":
        return f"lease {data['lease_id']} renewed until {data['expires_at_ms']}"
    if kind == "lease.completed":
        return f"lease {data['lease_id']} completed ({data.get('outcome')})"
    if kind == "lease.released":
        return f"lease {data['lease_id']} released ({data.get('reason')})"
    return kind


# --- the aggregate at a version --------------------------------------------------------


def aggregate_at(store, run_id: str, version: int | None = None) -> RunAggregate:
    """The Run as it stood while its run stream was at `version` (None: now).

    Folds run records 1..version, the StepRunMutations they caused (run_version <=
    version), and each lease record appended before run record version+1 — so the
    lease changes written with record `version` are in, and so are grants and
    renewals made while the Run stayed at that version. Admission writes versions
    1..n+1 (n steps) in one append, so the first version with a state is n+1."""
    log = read_run_log(store, run_id)
    head = len(log.run)
    first = 1 + len(log.run[0].data["plan"]["steps"])
    if version is None:
        version = head
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= head:
        raise InvalidInput(
            "version",
            "range",
            f"run {run_id!r} has versions 1..{head}; got {version!r}",
        )
    if version < first:
        raise InvalidInput(
            "version",
            "admitted",
            f"run {run_id!r} was admitted at versions 1..{first} in one append; "
            f"its first state is version {first}",
        )
    return fold(*_cut(log, version))


def _cut(log: RunLog, version: int):
    run = log.run[:version]
    steps = [r for r in log.steps if r.data.get("run_version", 0) <= version]
    before = log.run[version].global_position if version < len(log.run) else log.position + 1
    claimed = {r.data["attempt_id"] for r in run if r.type == "attempt.claimed"}
    leases = {
        attempt_id: [r for r in records if r.global_position < before]
        for attempt_id, records in log.leases.items()
        if attempt_id in claimed
    }
    return run, steps, leases


# --- why -------------------------------------------------------------------------------


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
        return self.root_cause is not None

    def to_dict(self) -> dict[str, Any]:
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


def why(store, run_id: str, now_ms: int) -> WhyReport:
    """Explain the Run at `now_ms`: what keeps it from being terminal, or why it ended."""
    if isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0:
        raise InvalidInput(
            "now_ms", "non-negative integer", f"now_ms must be an int >= 0, got {now_ms!r}"
        )
    log = read_run_log(store, run_id)
    aggregate = fold(log.run, log.steps, {a: list(rs) for a, rs in log.leases.items()})
    run = aggregate.run
    intent = _intent(log, aggregate, now_ms)
    deadline_passed = run.deadline_ms is not None and now_ms >= run.deadline_ms
    common = {
        "run_id": run.run_id,
        "status": run.status,
        "version": run.version,
        "now_ms": now_ms,
        "deadline_ms": run.deadline_ms,
        "deadline_passed": deadline_passed,
        "intent": intent,
    }
    if run.is_terminal:
        cause, ended_at = _root_cause(log, aggregate, intent)
        return WhyReport(**common, root_cause=cause, terminal_at_ms=ended_at)
    blocked, backlog = [], []
    for attempt in aggregate.active_attempts():
        block = _attempt_block(attempt, now_ms, intent)
        (backlog if block.status == ATTEMPT_CLAIMED and not block.lease_live else blocked).append(
            block
        )
    holding = {a.step_key for a in aggregate.active_attempts()}
    steps = tuple(
        _step_wait(aggregate, aggregate.steps[key], intent)
        for key in aggregate.topo_order
        if key not in holding and not aggregate.steps[key].is_terminal
    )
    return WhyReport(
        **common,
        blocked=tuple(blocked),
        backlog=tuple(backlog),
        steps=steps,
        next_cycle=_next_cycle(aggregate, intent, bool(blocked)),
    )


def _intent(log: RunLog, aggregate: RunAggregate, now_ms: int) -> Intent | None:
    effective = effective_intent(aggregate, now_ms)
    if effective is None:
        return None
    reason, at_ms = effective
    for record in log.run:
        if record.type == "workflow.cancel_requested":
            return Intent(reason, at_ms, record.metadata.get("actor"), recorded=True)
    return Intent(reason, at_ms, None, recorded=False)


def _ending(intent: Intent | None) -> str:
    return "timed_out" if intent is not None and intent.reason == "timeout" else "cancelled"


def _attempt_block(attempt: AttemptState, now_ms: int, intent: Intent | None) -> AttemptBlock:
    lease = attempt.lease
    live = attempt.has_live_lease(now_ms)
    held = lease is not None and lease.status == LEASE_LEASED
    if attempt.status == ATTEMPT_CLAIMED:
        if live:
            assert lease is not None
            after = (
                f"cancellation then ends it as {_ending(intent)}"
                if intent
                else "its step is requeued for a new Attempt"
            )
            next_step = (
                f"worker {lease.worker_id} holds lease {lease.lease_id} v{lease.version} until "
                f"{lease.expires_at_ms}; if it expires before the worker starts, recovery marks "
                f"the Attempt lost and {after}"
            )
        elif held:
            assert lease is not None
            next_step = (
                f"lease {lease.lease_id} of worker {lease.worker_id} expired at "
                f"{lease.expires_at_ms}: the next cycle's recovery marks the Attempt lost and "
                + (f"cancellation ends it as {_ending(intent)}" if intent else "requeues its step")
                + ("" if intent else " (unless a worker leases it again first)")
            )
        elif intent:
            next_step = f"the next cycle's cancellation ends it as {_ending(intent)}"
        else:
            next_step = "it waits for a worker to lease it (lease_attempts)"
    else:
        after = (
            "its step is left lost and cancellation ends it as cancelled"
            if intent
            else "its step fails (lease_expired): it is never run twice"
        )
        if live:
            assert lease is not None
            next_step = (
                f"worker {lease.worker_id} holds lease {lease.lease_id} v{lease.version} until "
                f"{lease.expires_at_ms}; it ends when the worker completes"
                + (" (as " + _ending(intent) + ": the Run has cancel intent)" if intent else "")
                + f"; if the lease expires first, recovery marks the Attempt lost and {after}"
            )
        else:
            gone = (
                f"lease {lease.lease_id} of worker {lease.worker_id} expired at "
                f"{lease.expires_at_ms}"
                if lease is not None
                else "it has no lease"
            )
            next_step = f"{gone}: the next cycle's recovery marks the Attempt lost and {after}"
    return AttemptBlock(
        attempt_id=attempt.attempt_id,
        step_key=attempt.step_key,
        attempt_number=attempt.attempt_number,
        status=attempt.status,
        lease_id=lease.lease_id if lease else None,
        lease_version=lease.version if lease else None,
        lease_status=lease.status if lease else None,
        worker_id=lease.worker_id if lease else attempt.worker_id,
        expires_at_ms=lease.expires_at_ms if lease else None,
        lease_live=live,
        next=next_step,
    )


def _step_wait(aggregate: RunAggregate, step, intent: Intent | None) -> StepWait:
    ending = _ending(intent)
    waiting_on: tuple[str, ...] = ()
    if step.status == STEP_PENDING:
        waiting_on = tuple(n for n in step.needs if aggregate.steps[n].status != "succeeded")
        if intent:
            next_step = "the next cycle's cancellation cancels it (it never ran)"
        elif any(aggregate.steps[n].status in STEP_TERMINAL for n in waiting_on):
            next_step = "a need did not succeed: the next cycle's frontier skips it"
        elif waiting_on:
            described = ", ".join(f"{n} ({aggregate.steps[n].status})" for n in waiting_on)
            next_step = f"it waits for {described} to succeed"
        else:
            next_step = "every need succeeded: the next cycle's frontier makes it ready"
    elif step.status in (STEP_READY, STEP_WAITING_APPROVAL):
        next_step = (
            f"the next cycle's cancellation ends it as {ending}"
            if intent
            else "the next cycle's attempt admission claims an Attempt for it"
        )
    elif step.status == STEP_LOST:
        next_step = (
            "its Attempt lost its lease after starting; cancellation ends it as cancelled"
            if intent
            else "its Attempt lost its lease after starting; it fails (lease_expired)"
        )
    elif step.status == STEP_RUNNING:
        next_step = "it is running without an active Attempt: it waits for recovery"
    else:
        next_step = "it waits"
    return StepWait(step.key, step.status, waiting_on, next_step)


def _next_cycle(aggregate: RunAggregate, intent: Intent | None, blocked: bool) -> str | None:
    statuses = [s.status for s in aggregate.steps.values()]
    if intent is not None:
        if blocked:
            return (
                f"the Run ends as {_ending(intent)} once no Attempt holds authority "
                "(the worker completes or recovery ends its lease)"
            )
        return (
            "nothing holds authority: the next cycle's cancellation ends the Run as "
            f"{_ending(intent)}"
        )
    outcome = aggregate_outcome(statuses)
    if outcome is not None:
        return f"every step is terminal: the next cycle's frontier ends the Run as {outcome[0]}"
    return None


def _root_cause(
    log: RunLog, aggregate: RunAggregate, intent: Intent | None
) -> tuple[RootCause, int | None]:
    run = aggregate.run
    final = log.run[-1]
    ended_at = final.metadata.get("at_ms")
    first_terminal: dict[str, Record] = {}  # step key -> the event that ended it
    for record in log.run:
        if _ends_step(record):
            first_terminal.setdefault(record.data["step_key"], record)
    if run.cancel_reason is not None:
        request = next(r for r in log.run if r.type == "workflow.cancel_requested")
        return (
            RootCause(
                status=run.status,
                kind="cancel_intent",
                position=request.global_position,
                at_ms=run.cancel_requested_at_ms,
                reason=run.cancel_reason,
                by=request.metadata.get("actor"),
                ended_by_cancel=tuple(
                    key
                    for key, r in first_terminal.items()
                    if r.global_position > request.global_position
                    and r.data["to"] in ("cancelled", "timed_out")
                ),
            ),
            ended_at,
        )
    if run.status == "succeeded":
        return RootCause(run.status, "succeeded", final.global_position, ended_at), ended_at
    wanted = {"failed": ("failed",), "timed_out": ("timed_out",), "cancelled": ("cancelled",)}
    culprits = [
        r
        for r in sorted(first_terminal.values(), key=lambda r: r.global_position)
        if r.data["to"] in wanted.get(run.status, ())
    ]
    if not culprits:  # a failed Run whose only non-successes are skips
        culprits = [
            r
            for r in sorted(first_terminal.values(), key=lambda r: r.global_position)
            if r.data["to"] != "succeeded"
        ]
    first = culprits[0]
    key = first.data["step_key"]
    attempt = aggregate.attempts.get(first.data.get("attempt_id") or "")
    descendants = _descendants(aggregate, key)
    skipped = tuple(
        k
        for k in aggregate.topo_order
        if k in descendants and aggregate.steps[k].status == "skipped"
    )
    return (
        RootCause(
            status=run.status,
            kind=f"step_{first.data['to']}",
            position=first.global_position,
            at_ms=first.metadata.get("at_ms"),
            step_key=key,
            result_code=first.data.get("result_code"),
            attempt_id=attempt.attempt_id if attempt else None,
            worker_id=(attempt.lease.worker_id if attempt and attempt.lease else None),
            skipped=skipped,
            other_failures=tuple(r.data["step_key"] for r in culprits[1:]),
        ),
        ended_at,
    )


def _ends_step(record: Record) -> bool:
    return (
        record.type.startswith("step.")
        and record.type != "step.created"
        and record.data["to"] in STEP_TERMINAL
    )


def _descendants(aggregate: RunAggregate, key: str) -> set[str]:
    found: set[str] = set()
    frontier = [key]
    while frontier:
        current = frontier.pop()
        for step in aggregate.steps.values():
            if current in step.needs and step.key not in found:
                found.add(step.key)
                frontier.append(step.key)
    return found


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


# --- following the log -----------------------------------------------------------------


def follow(
    store,
    after_position: int = 0,
    *,
    batch: int = 1000,
    poll_interval_s: float = 0.2,
    stop: Callable[[], bool] | None = None,
    types: Sequence[str] | None = None,
) -> Iterator[Record]:
    """Yield every event after `after_position` as it commits, in position order.

    Never skips one: positions become visible in order on both stores (see
    eventstore.postgres_store), so asking for positions after the last one seen is
    enough. When caught up it asks `stop()`; once that says True it reads what has
    committed meanwhile and returns (without `stop`, it follows forever)."""
    wanted = frozenset(types) if types is not None else None
    position = after_position
    stopping = False
    while True:
        records = store.read_all(position, batch)
        for record in records:
            position = record.global_position
            if wanted is None or record.type in wanted:
                yield record
        if len(records) == batch:
            continue
        if stopping:
            return
        if stop is not None and stop():
            stopping = True  # one more read: what committed before stop() said so
            continue
        time.sleep(poll_interval_s)
