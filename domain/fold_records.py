"""The fold of a Run's records into its state, record by record, with every
integrity rule of the log checked on the way (the rules: `domain.aggregate`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from domain.errors import CorruptionError
from domain.event_types import EventType, Family, of
from domain.plan import ExecutionPlan, PlanStep
from domain.plan_record import corrupt, is_int, plan_from_data, plan_order
from domain.records import Record
from domain.run_state import AttemptState, LeaseState, RunAggregate, RunState, StepRunState
from domain.streams import lease_stream, run_stream, steps_stream
from domain.transitions import (
    ATTEMPT_ACTIVE,
    ATTEMPT_CLAIMED,
    ATTEMPT_INTERRUPTED,
    ATTEMPT_TERMINAL,
    CANCEL_REASONS,
    LEASE_COMPLETED,
    LEASE_LEASED,
    LEASE_RELEASED,
    RELEASE_REASONS,
    RUN_RUNNING,
    RUN_TERMINAL,
    STEP_READY,
    STEP_STATUSES,
    STEP_SUCCEEDED,
    STEP_TERMINAL,
    Status,
    attempt_change_allowed,
    run_change_allowed,
    step_change_allowed,
)

MUTATION_TYPE = EventType.STEP_RUN_MUTATED
_NON_SUCCESS = STEP_TERMINAL - {Status.SUCCEEDED}
ATTEMPT_CHANGES = ATTEMPT_TERMINAL | {Status.STARTING, Status.RUNNING}
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class _StepEvent:
    """A step.* RunEvent waiting for its StepRunMutation."""

    run_version: int
    event_id: str
    step_run_id: str
    step_key: str
    from_status: str | None
    to_status: str
    epoch: int


class Folder:
    """Mutable working state of one fold; `freeze` hands out the immutable aggregate.

    States change as plain dicts of their fields ("work") and become frozen
    dataclasses again only in `freeze`, and only those that changed.
    """

    def __init__(self) -> None:
        self.run: dict[str, Any] | None = None
        self.plan: ExecutionPlan | None = None
        self.planned: dict[str, PlanStep] = {}
        self.stream_id = ""
        self.steps: dict[str, StepRunState] = {}
        self.step_work: dict[str, dict[str, Any]] = {}
        self.attempts: dict[str, AttemptState] = {}
        self.attempt_work: dict[str, dict[str, Any]] = {}
        self.steps_version = 0
        self.lease_versions: dict[str, int] = {}
        self.topo_order: tuple[str, ...] = ()
        self.created = 0
        self.unmatched: list[_StepEvent] = []
        self.matched = 0

    @classmethod
    def resume(cls, aggregate: RunAggregate) -> Folder:
        folder = cls()
        folder.run = _fields(aggregate.run)
        folder.plan = aggregate.run.plan
        folder.planned = {step.key: step for step in aggregate.run.plan.steps}
        folder.stream_id = run_stream(aggregate.run_id)
        folder.steps = dict(aggregate.steps)
        folder.attempts = dict(aggregate.attempts)
        folder.steps_version = aggregate.steps_version
        folder.lease_versions = dict(aggregate.lease_versions)
        folder.topo_order = aggregate.topo_order
        folder.created = len(aggregate.steps)
        return folder

    def step(self, key: str) -> dict[str, Any] | None:
        """The work copy of StepRun `key` (None if it does not exist)."""
        work = self.step_work.get(key)
        if work is None:
            frozen = self.steps.get(key)
            if frozen is None:
                return None
            work = self.step_work[key] = _fields(frozen)
        return work

    def attempt(self, attempt_id: str) -> dict[str, Any] | None:
        """The work copy of Attempt `attempt_id` (None if it does not exist)."""
        work = self.attempt_work.get(attempt_id)
        if work is None:
            frozen = self.attempts.get(attempt_id)
            if frozen is None:
                return None
            work = self.attempt_work[attempt_id] = _fields(frozen)
        return work

    def attempt_status(self, attempt_id: str) -> str:
        work = self.attempt_work.get(attempt_id)
        return work["status"] if work is not None else self.attempts[attempt_id].status

    # -- driver --

    def fold(
        self,
        run_records: Iterable[Record],
        step_records: Iterable[Record],
        lease_records: Mapping[str, Sequence[Record]],
    ) -> None:
        for record in run_records:
            self.run_record(record)
        run, plan = self.run, self.plan
        if run is None or plan is None:
            raise CorruptionError("no Run: the Run stream is empty")
        if self.created < len(plan.steps):
            missing = [s.key for s in plan.steps if self.step(s.key) is None]
            raise CorruptionError(
                f"{run_stream(plan.run_id)}: StepRuns {missing} of the plan were never created"
            )
        for record in step_records:
            self.mutation_record(record)
        if self.matched < len(self.unmatched):
            event = self.unmatched[self.matched]
            raise CorruptionError(
                f"{run_stream(plan.run_id)} v{event.run_version} ({event.event_id}, "
                f"step.{event.to_status}): has no StepRunMutation in "
                f"{steps_stream(plan.run_id)} (which ends at v{self.steps_version})"
            )
        for attempt_id, records in lease_records.items():
            for record in records:
                self.lease_record(attempt_id, record)

    def freeze(self) -> RunAggregate:
        assert self.run is not None
        steps = self.steps
        for key, work in self.step_work.items():
            steps[key] = StepRunState(**work)
        attempts = self.attempts
        for attempt_id, work in self.attempt_work.items():
            lease = work["lease"]
            if isinstance(lease, dict):
                work = {**work, "lease": LeaseState(**lease)}
            attempts[attempt_id] = AttemptState(**work)
        return RunAggregate(
            run=RunState(**self.run),
            steps=MappingProxyType(steps),
            attempts=MappingProxyType(attempts),
            steps_version=self.steps_version,
            lease_versions=MappingProxyType(self.lease_versions),
            topo_order=self.topo_order,
        )

    # -- run stream --

    def run_record(self, record: Record) -> None:
        run = self.run
        expected = 1 if run is None else run["version"] + 1
        if record.stream_version != expected:
            raise corrupt(record, f"version gap: expected v{expected}")
        data = record.data
        if not isinstance(data, Mapping):
            raise corrupt(record, "data is not an object")
        if run is None:
            self.admitted(record, data)
            return
        if record.stream_id != self.stream_id:
            raise corrupt(record, f"is not in stream {self.stream_id}")
        if run["status"] != RUN_RUNNING:
            raise corrupt(record, f"follows the Run's terminal status {run['status']!r}")
        event_type = record.type
        if self.created < len(self.planned) and event_type != _STEP_CREATED:
            raise corrupt(record, "comes before every StepRun of the plan was created")
        handler = _RUN_RECORD_FOLDS.get(event_type)
        if handler is None:
            raise corrupt(record, "is not a RunEvent type of docs/EVENTS.md")
        fold, name = handler
        try:
            if name is None:
                fold(self, record, data)
            else:
                fold(self, record, data, name)
        except (KeyError, TypeError) as error:
            raise corrupt(record, f"data is missing or mistyped: {error!r}") from None
        run["version"] = expected
        run["head_event_id"] = record.event_id

    def admitted(self, record: Record, data: Mapping[str, Any]) -> None:
        if record.type != EventType.WORKFLOW_ADMITTED:
            raise corrupt(record, "the Run stream must open with workflow.admitted")
        if "plan" not in data:
            raise corrupt(record, "workflow.admitted carries no plan")
        plan = plan_from_data(data["plan"], record)
        if record.stream_id != run_stream(plan.run_id):
            raise corrupt(record, f"its plan is for Run {plan.run_id!r}")
        admitted_at = data.get("admitted_at_ms")
        key = data.get("admission_key")
        if not isinstance(admitted_at, int) or not is_int(admitted_at) or not isinstance(key, str):
            raise corrupt(record, "admitted_at_ms or admission_key is missing or mistyped")
        queued = data.get("queued", False)
        if queued is not False and (queued is not True or plan.flow.run_slot is None):
            raise corrupt(record, "queues a Run whose plan binds no Workflow limit")
        timeout = plan.timeout_ms
        self.topo_order = plan_order(plan, record)
        self.plan = plan
        self.planned = {step.key: step for step in plan.steps}
        self.stream_id = record.stream_id
        self.run = {
            "run_id": plan.run_id,
            "status": RUN_RUNNING,
            "version": 1,
            "plan": plan,
            "admission_key": key,
            "admitted_at_ms": admitted_at,
            "timeout_ms": timeout,
            "deadline_ms": None if timeout is None else admitted_at + timeout,
            "cancel_requested_at_ms": None,
            "cancel_reason": None,
            "result_code": None,
            "error_code": None,
            "head_event_id": record.event_id,
            "queued": queued,
        }

    def step_created(self, record: Record, data: Mapping[str, Any]) -> None:
        key = data["step_key"]
        planned = self.planned.get(key)
        if planned is None:
            raise corrupt(record, f"creates StepRun {key!r}, which the plan lacks")
        if self.step(key) is not None:
            raise corrupt(record, f"creates StepRun {key!r} a second time")
        if data["step_run_id"] != planned.step_run_id:
            raise corrupt(record, f"StepRun id differs from the plan's {planned.step_run_id!r}")
        if data["status"] != planned.initial_status or data["epoch"] != 1:
            raise corrupt(record, f"must create {key!r} as {planned.initial_status!r} at epoch 1")
        self.step_work[key] = {
            "step_run_id": planned.step_run_id,
            "key": key,
            "status": planned.initial_status,
            "epoch": 1,
            "result_code": None,
            "needs": planned.needs,
            "task_id": planned.task_id,
            "task_ref": planned.task_ref,
            "source_digest": planned.source_digest,
            "attempt_ids": (),
            "retry_at_ms": None,
            "reused_from": None,
        }
        self.created += 1
        self.unmatched.append(
            _StepEvent(
                record.stream_version, record.event_id, planned.step_run_id, key, None,
                planned.initial_status, 1,
            )
        )  # fmt: skip

    def step_changed(self, record: Record, data: Mapping[str, Any], to_status: str) -> None:
        key = data["step_key"]
        step = self.step(key)
        if step is None:
            raise corrupt(record, f"changes unknown StepRun {key!r}")
        if data["step_run_id"] != step["step_run_id"]:
            raise corrupt(record, f"StepRun id differs from {step['step_run_id']!r}")
        if data["to"] != to_status:
            raise corrupt(record, f"'to' {data['to']!r} does not match the event type")
        from_status = step["status"]
        if data["from"] != from_status:
            raise corrupt(
                record, f"says StepRun {key!r} was {data['from']!r}, but it is {from_status!r}"
            )
        retry_at_ms = data.get("retry_at_ms")
        retry = retry_at_ms is not None
        if retry and (
            not is_int(retry_at_ms) or to_status != STEP_READY or self.planned[key].max_attempts < 2
        ):
            raise corrupt(record, f"StepRun {key!r} retries without a retry policy")
        interrupted = data.get(Status.INTERRUPTED.value) is True
        if interrupted and (
            to_status != STEP_READY
            or data.get("attempt_id") not in self.attempts.keys() | self.attempt_work.keys()
            or self.attempt_status(data["attempt_id"]) != ATTEMPT_INTERRUPTED
        ):
            raise corrupt(record, f"StepRun {key!r} is requeued by no interrupted Attempt")
        if not step_change_allowed(from_status, to_status, retry=retry, interrupted=interrupted):
            raise corrupt(record, f"StepRun {key!r}: {from_status} -> {to_status} is not allowed")
        epoch = data["epoch"]
        if epoch != step["epoch"] + 1:
            raise corrupt(record, f"StepRun {key!r} epoch {epoch}, expected {step['epoch'] + 1}")
        result_code = data.get("result_code")
        if to_status in _NON_SUCCESS and not isinstance(result_code, str):
            raise corrupt(record, f"a {to_status} StepRun must carry a result code")
        attempt_id = data.get("attempt_id")
        if (
            attempt_id is not None
            and attempt_id not in self.attempts
            and (attempt_id not in self.attempt_work)
        ):
            raise corrupt(record, f"names unknown Attempt {attempt_id!r}")
        step["status"] = to_status
        step["epoch"] = epoch
        step["result_code"] = result_code
        step["retry_at_ms"] = retry_at_ms
        self.unmatched.append(
            _StepEvent(
                record.stream_version, record.event_id, step["step_run_id"], key, from_status,
                to_status, epoch,
            )
        )  # fmt: skip

    def step_reused(self, record: Record, data: Mapping[str, Any]) -> None:
        """A rerun's reused step (docs/DESIGN.md "Reruns"): from its created status at
        epoch 1 straight to succeeded, with no Attempt, carrying its origin's output."""
        key = data["step_key"]
        step = self.step(key)
        if step is None or data["step_run_id"] != step["step_run_id"]:
            raise corrupt(record, f"reuses unknown StepRun {key!r}")
        if step["epoch"] != 1 or step["attempt_ids"] or data["from"] != step["status"]:
            raise corrupt(record, f"reuses StepRun {key!r}, which is no longer as created")
        if data["to"] != STEP_SUCCEEDED or data["epoch"] != 2:
            raise corrupt(record, f"must reuse {key!r} as succeeded at epoch 2")
        origin = data["reused_from"]
        if not isinstance(origin.get("run_id"), str) or not isinstance(
            origin.get("attempt_id"), str
        ):
            raise corrupt(record, "reused_from must name a run_id and an attempt_id")
        output = data["output"]
        step["status"] = STEP_SUCCEEDED
        step["epoch"] = 2
        step["reused_from"] = MappingProxyType(
            {
                "run_id": origin["run_id"],
                "attempt_id": origin["attempt_id"],
                "output": None if output is None else MappingProxyType(dict(output)),
            }
        )
        self.unmatched.append(
            _StepEvent(
                record.stream_version, record.event_id, step["step_run_id"], key, data["from"],
                STEP_SUCCEEDED, 2,
            )
        )  # fmt: skip

    def attempt_claimed(self, record: Record, data: Mapping[str, Any]) -> None:
        attempt_id = data["attempt_id"]
        key = data["step_key"]
        if attempt_id in self.attempts or attempt_id in self.attempt_work:
            raise corrupt(record, f"claims Attempt {attempt_id!r} a second time")
        step = self.step(key)
        if step is None or data["step_run_id"] != step["step_run_id"]:
            raise corrupt(record, f"claims an Attempt for unknown StepRun {key!r}")
        if step["status"] != STEP_READY or data["step_epoch"] != step["epoch"]:
            raise corrupt(
                record,
                f"admits against epoch {data['step_epoch']} of StepRun {key!r}, which is "
                f"{step['status']} at epoch {step['epoch']}",
            )
        for other in step["attempt_ids"]:
            if self.attempt_status(other) in ATTEMPT_ACTIVE:
                raise corrupt(record, f"StepRun {key!r} already has active Attempt {other!r}")
        number = len(step["attempt_ids"]) + 1
        if data["attempt_number"] != number:
            raise corrupt(record, f"attempt_number should be {number}")
        admission = data["admission"]
        if not isinstance(admission, Mapping):
            raise corrupt(record, "carries no admission")
        self.attempt_work[attempt_id] = {
            **_ATTEMPT_DEFAULTS,
            "attempt_id": attempt_id,
            "step_key": key,
            "step_run_id": step["step_run_id"],
            "step_epoch": step["epoch"],
            "attempt_number": number,
            "admission": MappingProxyType(dict(admission)),
            "status": ATTEMPT_CLAIMED,
        }
        step["attempt_ids"] = (*step["attempt_ids"], attempt_id)

    def attempt_changed(self, record: Record, data: Mapping[str, Any], to_status: str) -> None:
        attempt_id = data["attempt_id"]
        attempt = self.attempt(attempt_id)
        if attempt is None:
            raise corrupt(record, f"changes unknown Attempt {attempt_id!r}")
        if not attempt_change_allowed(attempt["status"], to_status):
            raise corrupt(
                record,
                f"Attempt {attempt_id!r}: {attempt['status']} -> {to_status} is not allowed",
            )
        if to_status in ATTEMPT_TERMINAL:
            output = data.get("output")
            attempt["result_code"] = data.get("result_code")
            attempt["reported_outcome"] = data.get("reported_outcome")
            attempt["output"] = None if output is None else MappingProxyType(dict(output))
            attempt["ended_lease_id"] = data.get("lease_id")
        elif to_status == Status.STARTING:
            attempt["started_lease_id"] = data["lease_id"]
            attempt["worker_id"] = data.get("worker_id")
            started_at = data.get("started_at_ms")
            if started_at is not None and not is_int(started_at):
                raise corrupt(record, f"started_at_ms {started_at!r} is not an instant")
            attempt["started_at_ms"] = started_at
        elif data["lease_id"] != attempt["started_lease_id"]:
            raise corrupt(record, "runs under another lease than the one it started under")
        attempt["status"] = to_status

    def cancel_requested(self, record: Record, data: Mapping[str, Any]) -> None:
        run = self.run
        assert run is not None
        if run["cancel_reason"] is not None:
            raise corrupt(record, "the Run already has a cancel intent")
        reason = data["reason"]
        at_ms = data["requested_at_ms"]
        if reason not in CANCEL_REASONS or not is_int(at_ms):
            raise corrupt(record, f"reason {reason!r} / requested_at_ms {at_ms!r} is invalid")
        run["cancel_reason"] = reason
        run["cancel_requested_at_ms"] = at_ms

    def dequeued(self, record: Record, data: Mapping[str, Any]) -> None:
        run = self.run
        assert run is not None and self.plan is not None
        ref = self.plan.flow.run_slot
        if not run["queued"] or ref is None or data["slot"] != ref.slot:
            raise corrupt(record, "dequeues a Run that is not queued for that slot")
        run["queued"] = False

    def run_ended(self, record: Record, data: Mapping[str, Any], status: str) -> None:
        run = self.run
        assert run is not None
        if not run_change_allowed(run["status"], status):
            raise corrupt(record, f"Run: {run['status']} -> {status} is not allowed")
        run["status"] = status
        run["result_code"] = data.get("result_code")
        run["error_code"] = data.get("error_code")

    # -- steps stream --

    def mutation_record(self, record: Record) -> None:
        assert self.plan is not None
        expected = self.steps_version + 1
        if record.stream_version != expected:
            raise corrupt(record, f"version gap: expected v{expected}")
        if record.stream_id != steps_stream(self.plan.run_id):
            raise corrupt(record, f"is not in stream {steps_stream(self.plan.run_id)}")
        if record.type != _MUTATION_TYPE:
            raise corrupt(record, f"a StepRunMutation must have type {MUTATION_TYPE}")
        data = record.data
        if self.matched >= len(self.unmatched):
            raise corrupt(
                record,
                f"points at {data.get('event_id')!r} at run version {data.get('run_version')}, "
                "which is not a step.* event without a mutation",
            )
        event = self.unmatched[self.matched]
        pointed = (data.get("run_version"), data.get("event_id"))
        if pointed != (event.run_version, event.event_id):
            raise corrupt(
                record,
                f"points at {pointed[1]!r} at run version {pointed[0]}, but the next step.* "
                f"event is {event.event_id!r} at run version {event.run_version}",
            )
        described = (
            data.get("step_run_id"), data.get("step_key"), data.get("from"), data.get("to"),
            data.get("step_epoch"),
        )  # fmt: skip
        actual = (
            event.step_run_id, event.step_key, event.from_status, event.to_status, event.epoch,
        )  # fmt: skip
        if described != actual:
            raise corrupt(record, f"describes {described}, but its event says {actual}")
        self.matched += 1
        self.steps_version = expected

    # -- lease streams --

    def lease_record(self, attempt_id: str, record: Record) -> None:
        attempt = self.attempt(attempt_id)
        if attempt is None:
            raise corrupt(record, f"is the lease of unknown Attempt {attempt_id!r}")
        if record.stream_id != lease_stream(attempt_id):
            raise corrupt(record, f"is not in stream {lease_stream(attempt_id)}")
        version = record.stream_version
        expected = self.lease_versions.get(attempt_id, 0) + 1
        if version != expected:
            raise corrupt(record, f"version gap: expected v{expected}")
        data = record.data
        lease = attempt["lease"]
        if isinstance(lease, LeaseState):
            lease = attempt["lease"] = _fields(lease)
        try:
            kind = record.type
            if kind == _LEASE_GRANTED:
                if lease is not None and lease["status"] != LEASE_RELEASED:
                    raise corrupt(
                        record, f"grants while lease {lease['lease_id']!r} is {lease['status']}"
                    )
                attempt["lease"] = {
                    "lease_id": data["lease_id"],
                    "version": version,
                    "granted_version": version,
                    "worker_id": data["worker_id"],
                    "status": LEASE_LEASED,
                    "granted_at_ms": data["granted_at_ms"],
                    "ttl_ms": data["ttl_ms"],
                    "expires_at_ms": data["expires_at_ms"],
                    "outcome": None,
                    "release_reason": None,
                }
                attempt["lease_ids"] = (*attempt["lease_ids"], data["lease_id"])
            else:
                if lease is None or lease["status"] != LEASE_LEASED:
                    raise corrupt(record, "changes a lease that is not held")
                if data["lease_id"] != lease["lease_id"]:
                    raise corrupt(
                        record, f"names lease {data['lease_id']!r}, not {lease['lease_id']!r}"
                    )
                if kind == _LEASE_RENEWED:
                    lease["version"] = version
                    lease["ttl_ms"] = data["ttl_ms"]
                    lease["expires_at_ms"] = data["expires_at_ms"]
                elif kind == _LEASE_COMPLETED:
                    lease["status"] = LEASE_COMPLETED
                    lease["outcome"] = data["outcome"]
                elif kind == _LEASE_RELEASED:
                    if data["reason"] not in RELEASE_REASONS:
                        raise corrupt(record, f"release reason {data['reason']!r} is unknown")
                    lease["status"] = LEASE_RELEASED
                    lease["release_reason"] = data["reason"]
                else:
                    raise corrupt(record, "is not a lease event type of docs/EVENTS.md")
        except (KeyError, TypeError) as error:
            raise corrupt(record, f"data is missing or mistyped: {error!r}") from None
        self.lease_versions[attempt_id] = version


_ATTEMPT_DEFAULTS = {
    "lease": None,
    "lease_ids": (),
    "started_lease_id": None,
    "started_at_ms": None,
    "worker_id": None,
    "result_code": None,
    "reported_outcome": None,
    "output": None,
    "ended_lease_id": None,
}


def _fields(state: Any) -> dict[str, Any]:
    """A frozen (slotted) dataclass as a dict of its fields."""
    return {name: getattr(state, name) for name in state.__dataclass_fields__}


# The hot loops compare a record's type (a plain str) with these plain values: a
# StrEnum member's lookup and comparison cost several times a str's (docs/DESIGN.md,
# "Rebuild").
_STEP_CREATED = EventType.STEP_CREATED.value
_MUTATION_TYPE = MUTATION_TYPE.value
_LEASE_GRANTED = EventType.LEASE_GRANTED.value
_LEASE_RENEWED = EventType.LEASE_RENEWED.value
_LEASE_COMPLETED = EventType.LEASE_COMPLETED.value
_LEASE_RELEASED = EventType.LEASE_RELEASED.value


def _run_record_folds() -> dict[str, tuple[Any, str | None]]:
    """Every RunEvent type after admission -> the Folder method that folds it, and the
    status it changes to (None: the method takes none)."""
    folds: dict[str, tuple[Any, str | None]] = {}
    for family, statuses, method in (
        (Family.WORKFLOW, RUN_TERMINAL, Folder.run_ended),
        (Family.ATTEMPT, ATTEMPT_CHANGES, Folder.attempt_changed),
        (Family.STEP, STEP_STATUSES, Folder.step_changed),
    ):
        for status in statuses:
            folds[of(family, status)] = (method, Status(status).value)
    folds[EventType.WORKFLOW_CANCEL_REQUESTED.value] = (Folder.cancel_requested, None)
    folds[EventType.WORKFLOW_DEQUEUED.value] = (Folder.dequeued, None)
    folds[EventType.ATTEMPT_CLAIMED.value] = (Folder.attempt_claimed, None)
    folds[EventType.STEP_REUSED.value] = (Folder.step_reused, None)
    folds[EventType.STEP_CREATED.value] = (Folder.step_created, None)
    return folds


_RUN_RECORD_FOLDS = _run_record_folds()
