"""What a decision returns, and the one builder every decision writes its records with.

A `Decision` holds the appends to make (one `StreamAppend` per stream, each with
the expected version the decision was computed against) and what the caller
reports: the blocked set, counters, the Run's new terminal status, a granted or
renewed lease. `DecisionBuilder` allocates contiguous versions, pairs every
`step.*` RunEvent with its StepRunMutation, refuses any status change docs/DESIGN.md ("States")
does not allow, and stamps metadata `{at_ms, causation_id, correlation_id, actor}`
— so no decision formats a record by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.aggregate import MUTATION_TYPE, RunAggregate, StepRunState
from domain.errors import InvalidInput
from domain.event_types import EventType, Family, of
from domain.ids import LEASE_EVENT, derive_id
from domain.notify import NotifyRule, due_append
from domain.records import NewEvent, StreamAppend
from domain.streams import lease_stream, run_stream, steps_stream
from domain.transitions import STEP_SUCCEEDED, STEP_TERMINAL, Status, step_change_allowed


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """The lease a worker holds after a grant or renewal: present (lease_id, version)."""

    attempt_id: str
    lease_id: str
    version: int
    worker_id: str
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class Decision:
    """The records one decision appends, and what it means for the caller.

    - `appends`: run stream (expected = aggregate version), steps stream
      (expected = steps_version), lease streams (expected = lease version);
      streams without events are left out.
    - `blocked`: ids of Attempts and StepRuns that still hold execution authority
      (cancellation only), sorted: Attempt ids first, then StepRun ids.
    - `settled_attempts` / `settled_steps`: Attempts / StepRuns this decision ended.
    - `run_terminal`: the Run's terminal status when this decision ends it.
    - `lease`: the lease granted or renewed (worker decisions).
    - `stop_requested`: on a renewal, the Run has cancel intent: stop the work.
    - `step_timed_out`: on a renewal, the Attempt ran past its step's timeout: stop it
      and complete it `timed_out` (docs/DESIGN.md, "Step timeouts").
    - `replayed`: the same worker write already happened; nothing new to append.
    - `after`: the Run as these records leave it, where the decision folded it
      already (the run path's chained decisions do; None: `run_path.applied` folds it).
    """

    appends: tuple[StreamAppend, ...] = ()
    blocked: tuple[str, ...] = ()
    settled_attempts: int = 0
    settled_steps: int = 0
    run_terminal: str | None = None
    lease: LeaseGrant | None = None
    stop_requested: bool = False
    step_timed_out: bool = False
    replayed: bool = False
    after: RunAggregate | None = None

    @property
    def noop(self) -> bool:
        """True when there is nothing to append."""
        return not self.appends

    def events(self, stream_id: str) -> tuple[NewEvent, ...]:
        """The events this decision appends to `stream_id` (empty if none)."""
        for append in self.appends:
            if append.stream_id == stream_id:
                return append.events
        return ()


EMPTY = Decision()


def check_now(now_ms: object) -> int:
    """Refuse an observation time that is not a non-negative integer."""
    if isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0:
        raise InvalidInput(
            "now_ms", "non_negative_int", f"now_ms must be an int >= 0, got {now_ms!r}"
        )
    return now_ms


def sibling_id(prefix: str, base_id: str) -> str:
    """The id of a record born with `base_id` (a StepRunMutation with its RunEvent, an
    Attempt with its claim event): the same 32 hex digits under its own prefix."""
    return prefix + base_id[-32:]


class HasWork(Exception):  # an answer, not an error
    """Raised by a probe builder at its first record: the decision has work."""


class DecisionBuilder:
    """Collects the records of one decision over one Run.

    Versions come from the aggregate the decision was computed against; StepRun
    statuses and epochs are projected as changes are added, so a decision can
    chain changes (running → lost → failed) and read its own result.
    """

    def __init__(
        self,
        *,
        run_id: str,
        run_version: int,
        steps_version: int,
        steps: Mapping[str, StepRunState],
        lease_versions: Mapping[str, int],
        now_ms: int,
        actor: str,
        causation_id: str | None,
        probe: bool = False,
    ) -> None:
        self.run_id = run_id
        self.probe = probe
        self.now_ms = now_ms
        self.actor = actor
        self.causation_id = causation_id
        self._base_run_version = run_version
        self._base_steps_version = steps_version
        self._lease_base = lease_versions
        self._run_events: list[NewEvent] = []
        self._mutations: list[NewEvent] = []
        self._lease_events: dict[str, list[NewEvent]] = {}
        self._outbox: StreamAppend | None = None
        self._base_steps = steps
        # key -> (step_run_id, status, epoch) of the StepRuns this decision changed
        self._changed: dict[str, tuple[str, str, int]] = {}
        self._version = run_version
        self._shared_metadata: dict[str, Any] | None = None
        self.settled_steps = 0
        self.settled_attempts = 0

    @classmethod
    def on(
        cls,
        aggregate: RunAggregate,
        now_ms: int,
        actor: str,
        causation_id: str | None = None,
        *,
        probe: bool = False,
    ) -> DecisionBuilder:
        """A builder over `aggregate`; causation defaults to the Run's latest event.
        A `probe` builder raises `HasWork` at the first record added: the decision
        is only asked whether it writes (`domain.work`)."""
        return cls(
            run_id=aggregate.run_id,
            run_version=aggregate.version,
            steps_version=aggregate.steps_version,
            steps=aggregate.steps,
            lease_versions=aggregate.lease_versions,
            now_ms=now_ms,
            actor=actor,
            causation_id=causation_id or aggregate.run.head_event_id,
            probe=probe,
        )

    # -- reading the projection --

    @property
    def run_version(self) -> int:
        """The Run's version after the events added so far."""
        return self._version

    def _current(self, key: str) -> tuple[str, str, int]:
        changed = self._changed.get(key)
        if changed is not None:
            return changed
        step = self._base_steps[key]
        return step.step_run_id, step.status, step.epoch

    def step(self, key: str) -> tuple[str, int]:
        """Projected (status, epoch) of a StepRun."""
        _, status, epoch = self._current(key)
        return status, epoch

    def step_statuses(self) -> dict[str, str]:
        """Projected status of every StepRun, by key."""
        statuses = {key: step.status for key, step in self._base_steps.items()}
        statuses.update((key, status) for key, (_, status, _) in self._changed.items())
        return statuses

    def all_steps_terminal(self) -> bool:
        return all(status in STEP_TERMINAL for status in self.step_statuses().values())

    def lease_version(self, attempt_id: str) -> int:
        """The lease stream's version after the events added so far."""
        added = len(self._lease_events.get(attempt_id, ()))
        return self._lease_base.get(attempt_id, 0) + added

    # -- adding records --

    def _metadata(self, causation_id: str | None) -> dict[str, Any]:
        """Metadata for a record; records with the same cause share one (read-only) dict."""
        shared = self._shared_metadata
        if shared is None or shared["causation_id"] != causation_id:
            shared = self._shared_metadata = {
                "at_ms": self.now_ms,
                "causation_id": causation_id,
                "correlation_id": self.run_id,
                "actor": self.actor,
            }
        return shared

    def event(
        self, event_id: str, event_type: str, data: dict[str, Any], causation_id: str | None = None
    ) -> int:
        """Append a RunEvent; returns its version. Not for step.* events (see change_step)."""
        if self.probe:
            raise HasWork
        self._run_events.append(
            NewEvent(event_id, event_type, data, self._metadata(causation_id or self.causation_id))
        )
        self._version += 1
        return self._version

    def create_step(
        self, key: str, step_run_id: str, status: str, event_id: str, mutation_id: str
    ) -> None:
        """`step.created` at epoch 1 with its StepRunMutation (admission only)."""
        data = {"step_run_id": step_run_id, "step_key": key, "status": status, "epoch": 1}
        version = self.event(event_id, EventType.STEP_CREATED, data)
        self._mutation(mutation_id, step_run_id, key, None, status, 1, version, event_id)
        self._changed[key] = (step_run_id, status, 1)

    def change_step(
        self,
        key: str,
        to_status: str,
        ids: tuple[str, str, tuple[Any, ...]],
        *,
        result_code: str | None = None,
        attempt_id: str | None = None,
        retry_at_ms: int | None = None,
        interrupted: bool = False,
    ) -> None:
        """`step.<to>` and its StepRunMutation; the epoch grows by one. `retry_at_ms`
        (a retry: running -> ready) is when the next Attempt may be claimed;
        `interrupted` (running -> ready) says its host stopped the Attempt.

        `ids` is (event prefix, mutation prefix, id parts): the event id derives
        from the durable parts, the mutation id shares its digest — a
        recomputation yields the same pair.
        """
        step_run_id, from_status, epoch = self._current(key)
        if not step_change_allowed(
            from_status, to_status, retry=retry_at_ms is not None, interrupted=interrupted
        ):
            raise AssertionError(f"decision bug: StepRun {key!r} {from_status} -> {to_status}")
        event_prefix, mutation_prefix, parts = ids
        event_id = derive_id(event_prefix, *parts)
        epoch += 1
        data = {
            "step_run_id": step_run_id,
            "step_key": key,
            "from": from_status,
            "to": to_status,
            "epoch": epoch,
            "result_code": result_code,
            "attempt_id": attempt_id,
        }
        if retry_at_ms is not None:  # only a retry carries it: v1 events stay as they were
            data["retry_at_ms"] = retry_at_ms
        if interrupted:  # likewise only an interruption
            data[Status.INTERRUPTED.value] = True
        version = self.event(event_id, of(Family.STEP, to_status), data)
        self._mutation(
            sibling_id(mutation_prefix, event_id), step_run_id, key, from_status, to_status, epoch,
            version, event_id,
        )  # fmt: skip
        self._changed[key] = (step_run_id, to_status, epoch)
        if to_status in STEP_TERMINAL:
            self.settled_steps += 1

    def reuse_step(
        self,
        key: str,
        origin: Mapping[str, Any],
        output: Any,
        ids: tuple[str, str, tuple[Any, ...]],
    ) -> None:
        """`step.reused` and its StepRunMutation: a rerun's StepRun, as created, is
        succeeded with `output` of the Attempt `origin` names (docs/DESIGN.md "Reruns")."""
        step_run_id, from_status, epoch = self._current(key)
        if epoch != 1:
            raise AssertionError(f"decision bug: StepRun {key!r} reused at epoch {epoch}")
        event_prefix, mutation_prefix, parts = ids
        event_id = derive_id(event_prefix, *parts)
        data = {
            "step_run_id": step_run_id,
            "step_key": key,
            "from": from_status,
            "to": STEP_SUCCEEDED,
            "epoch": 2,
            "result_code": None,
            "attempt_id": None,
            "reused_from": dict(origin),
            "output": output,
        }
        version = self.event(event_id, EventType.STEP_REUSED, data)
        self._mutation(
            sibling_id(mutation_prefix, event_id), step_run_id, key, from_status, STEP_SUCCEEDED,
            2, version, event_id,
        )  # fmt: skip
        self._changed[key] = (step_run_id, STEP_SUCCEEDED, 2)
        self.settled_steps += 1

    def _mutation(
        self,
        mutation_id: str,
        step_run_id: str,
        key: str,
        from_status: str | None,
        to_status: str,
        epoch: int,
        run_version: int,
        event_id: str,
    ) -> None:
        data = {
            "step_run_id": step_run_id,
            "step_key": key,
            "from": from_status,
            "to": to_status,
            "step_epoch": epoch,
            "run_version": run_version,
            "event_id": event_id,
        }
        # a mutation names its RunEvent in `data`; it shares the event's cause
        self._mutations.append(
            NewEvent(mutation_id, MUTATION_TYPE, data, self._metadata(self.causation_id))
        )

    def lease_event(
        self,
        attempt_id: str,
        event_type: str,
        data: dict[str, Any],
        *,
        parts: tuple[Any, ...] = (),
        born_with: str | None = None,
    ) -> int:
        """Append to `lease-<attempt_id>`; returns the new lease version.

        A lease event written with an Attempt event shares that event's digest
        (`born_with`); otherwise its id derives from the attempt, the stream
        position, the type and `parts` (which name the lease and the writer), so
        two different writes competing for one position get different ids and
        meet a version conflict rather than an idempotency conflict.
        """
        if self.probe:
            raise HasWork
        version = self.lease_version(attempt_id) + 1
        if born_with is not None:
            event_id = sibling_id(LEASE_EVENT, born_with)
        else:
            event_id = derive_id(LEASE_EVENT, attempt_id, version, event_type, *parts)
        self._lease_events.setdefault(attempt_id, []).append(
            NewEvent(event_id, event_type, data, self._metadata(self.causation_id))
        )
        return version

    def end_run(
        self,
        event_id: str,
        run_terminal: str,
        data: dict[str, Any],
        notify: tuple[NotifyRule, ...],
        workflow_key: str,
    ) -> None:
        """`workflow.<terminal>`, last, and the outbox records of the notify rules
        it matches, in the same commit (docs/DESIGN.md "Notifications")."""
        self.event(event_id, of(Family.WORKFLOW, run_terminal), data)
        self._outbox = due_append(
            self.run_id, workflow_key, notify, run_terminal, data.get("result_code"), event_id,
            self._metadata(self.causation_id),
        )  # fmt: skip

    # -- result --

    @property
    def is_empty(self) -> bool:
        return not self._run_events and not self._lease_events

    def build(self, **fields: Any) -> Decision:
        """The Decision: appends in a fixed order (run, steps, leases by attempt id)."""
        appends: list[StreamAppend] = []
        if self._run_events:
            appends.append(
                StreamAppend(
                    run_stream(self.run_id), self._base_run_version, tuple(self._run_events)
                )
            )
        if self._mutations:
            appends.append(
                StreamAppend(
                    steps_stream(self.run_id), self._base_steps_version, tuple(self._mutations)
                )
            )
        for attempt_id in sorted(self._lease_events):
            appends.append(
                StreamAppend(
                    lease_stream(attempt_id),
                    self._lease_base.get(attempt_id, 0),
                    tuple(self._lease_events[attempt_id]),
                )
            )
        if self._outbox is not None:
            appends.append(self._outbox)
        fields.setdefault("settled_steps", self.settled_steps)
        fields.setdefault("settled_attempts", self.settled_attempts)
        return Decision(appends=tuple(appends), **fields)
