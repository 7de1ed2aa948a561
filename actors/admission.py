"""Durable Workflow admission in one transaction (docs/DESIGN.md "Durable admission").

`admit_in_tx` does, inside the caller's transaction:

1. resolve the package to a publication (the current head of its installation,
   or an explicit publication id) and take the serialization boundary shared
   with publisher revocation (`actors.publishing.serialize_publisher`);
2. exact replay: a receipt for the admission key whose plan equals the request's
   is returned with status "existing"; the same key with another plan, or the
   same run id under another key, is an `AdmissionCollision`;
3. the start guard (`domain.start_guard`): the publication is active (not
   withdrawn, not quarantined), the current head of its installation, its publisher
   not revoked, and the Workflow exists and is enabled -- else `StartGuardError`
   with `.reason`;
4. build the plan and append `workflow.admitted`, the `step.created` events, the
   StepRunMutations, the Attempts claimed for its ready roots (as the cycle's
   attempt admission would claim them, `domain.run_path.admit_and_claim`) and the
   receipt in one `registry.commit`.

Any refusal raises before the commit, so nothing is written.

Where the schema has least-privilege roles (`actors.roles`), the runtime role may
not read the publication tables: every read of a publication, its publisher's
status and its published revision goes through the SECURITY DEFINER function
`qlflow_admission_source` (projections.admission_source), which also takes the
publisher's lock (`PublicationReads`). Elsewhere the same reads go to the read
models directly.

Replay comes before the guard on purpose: an exact replay is not a new start, so
it is answered even if the publication was withdrawn meanwhile (that stops new
starts only). This is what makes a retry after a lost COMMIT response
safe: the retry finds the receipt and returns it as "existing". The plan of a
replay is rebuilt against the publication named in the receipt, so a newer head
does not turn a retry into a collision.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from actors.authority import Units
from actors.loading import slot_lock
from actors.planned_workflows import PlannedWorkflows
from actors.publishing import PUBLICATION_STREAM, serialize_publisher
from actors.retrying import replay_once
from domain.admission import admission_records
from domain.aggregate import RunAggregate
from domain.errors import (
    AdmissionCollision,
    CorruptionError,
    InvalidInput,
    ManifestError,
    NotFound,
    PlanError,
    SchemaError,
    StartGuardError,
    VersionConflict,
)
from domain.event_types import EventType
from domain.fields import ID_PATTERN
from domain.ids import PUBLICATION_ID, RECEIPT, RUN_ID, derive_id
from domain.plan import (
    ExecutionPlan,
    PlannedWorkflow,
    bind_plan,
    plan_workflow,
    step_run_ids_for,
)
from domain.publication import PublicationRef, publication_from_json
from domain.records import NewEvent, Record, StreamAppend
from domain.rerun import Reuse, reused_steps
from domain.revision import MaterializedRevision, revision_from_json
from domain.run_path import admit_and_claim
from domain.slots import takes_slot_at_admission
from domain.start_guard import check_start
from domain.streams import run_stream, steps_stream
from domain.text import is_storable_text
from domain.values import (
    CREATED,
    EXISTING,
    AdmissionReceipt,
    Publication,
    ReceiptStep,
    receipt_document,
    receipt_from_document,
    receipt_stream_id,
)
from eventstore.api import Reads, Transaction
from projections import admission_guard, admission_source
from projections import limits as limit_rows
from projections import publications as read_model
from projections import retention as retained
from projections.registry import commit, commit_through

MAX_ADMISSION_KEY_CHARS = 1024
ADMISSION_ACTOR = "admission"
# Deliberate refusals: retrying cannot change the answer.
REFUSALS = (
    AdmissionCollision,
    CorruptionError,
    InvalidInput,
    ManifestError,
    NotFound,
    PlanError,
    SchemaError,
    StartGuardError,
)
REPLAY_ONCE = replay_once(REFUSALS)  # actors.retrying


@dataclass(frozen=True, slots=True)
class Rerun:
    """What makes an admission a rerun (docs/DESIGN.md "Reruns"): the source Run's
    aggregate, the steps to run again (None: those that did not succeed), whether it
    binds the source's own publication, and the `rerun_of` record of the new Run."""

    source: RunAggregate
    from_steps: tuple[str, ...] | None
    same_plan: bool
    rerun_of: Mapping[str, Any]


def admission_identity(admission_key: str | None, run_id: str | None) -> tuple[str, str]:
    """Resolve (admission key, run id) once, before any attempt or retry.

    No key and no run id: a random key (uuid4 hex). A run id without a key: the
    run id is the key. The run id defaults to derive_id(RUN_ID, key), so retrying
    with the same key always names the same Run.
    """
    if admission_key is not None and (
        not is_storable_text(admission_key) or len(admission_key) > MAX_ADMISSION_KEY_CHARS
    ):
        raise InvalidInput(
            "admission_key",
            "text",
            f"admission_key must be a non-empty string of at most {MAX_ADMISSION_KEY_CHARS} "
            f"characters of UTF-8 text without NUL, got {admission_key!r}",
        )
    if run_id is not None and (not isinstance(run_id, str) or not ID_PATTERN.fullmatch(run_id)):
        raise InvalidInput(
            "run_id",
            "id",
            f"run_id must be 1-36 characters of A-Z a-z 0-9 : . _ -, starting with a letter "
            f"or digit, got {run_id!r}",
        )
    if admission_key is None:
        admission_key = run_id if run_id is not None else uuid.uuid4().hex
    if run_id is None:
        run_id = derive_id(RUN_ID, admission_key)
    return admission_key, run_id


def start(
    authority: Units,
    package: str,
    workflow_key: str,
    *,
    admission_key: str | None = None,
    run_id: str | None = None,
    timeout_ms: int | None = None,
    params: Mapping[str, Any] | None = None,
    priority: int | None = None,
    now_ms: int,
) -> AdmissionReceipt:
    """Admit through an operation authority (`authority.execute(fn, name)`).

    The identity is fixed before the first attempt. A failure that is not a
    deliberate refusal (a concurrent admission of the same key, a lost COMMIT
    response, a dropped connection) is retried once in a new transaction, which
    returns the durable receipt ("existing") if the first attempt committed.
    """
    admission_key, run_id = admission_identity(admission_key, run_id)

    def unit(tx: Transaction) -> tuple[AdmissionReceipt, RunAggregate | None]:
        return _admit(
            tx,
            package,
            workflow_key,
            admission_key,
            run_id,
            timeout_ms,
            now_ms,
            params,
            authority.workflows,
            priority=priority,
            at_commit=True,  # REPLAY_ONCE: a conflict's next try answers with the receipt
        )

    receipt, admitted = REPLAY_ONCE.execute(authority, unit, "admission")
    if admitted is not None:
        authority.aggregates.put([admitted])
    return receipt


def admit_in_tx(
    tx: Transaction,
    package: str,
    workflow_key: str,
    admission_key: str | None,
    run_id: str | None,
    timeout_ms: int | None,
    now_ms: int,
    params: Mapping[str, Any] | None = None,
    workflows: PlannedWorkflows | None = None,
) -> AdmissionReceipt:
    """Admit one Run of `workflow_key` from `package` in the open transaction `tx`.

    `package` is an installation name, a package name (when exactly one head has
    it) or an explicit publication id ("pub:..."); `params` are the Workflow's
    parameter values (the plan binds them). Returns the receipt with status
    "created", or "existing" for an exact replay. Raises StartGuardError (with
    `.reason`), AdmissionCollision, PlanError, NotFound or InvalidInput, writing
    nothing. Call `admission_identity` first when retrying with a generated key.
    `workflows`: the Workflows this process has checked already (none: check it).
    """
    receipt, _ = _admit(
        tx, package, workflow_key, admission_key, run_id, timeout_ms, now_ms, params, workflows
    )
    return receipt


def _admit(
    tx: Transaction,
    package: str,
    workflow_key: str,
    admission_key: str | None,
    run_id: str | None,
    timeout_ms: int | None,
    now_ms: int,
    params: Mapping[str, Any] | None = None,
    workflows: PlannedWorkflows | None = None,
    rerun: Rerun | None = None,
    *,
    priority: int | None = None,
    at_commit: bool = False,
) -> tuple[AdmissionReceipt, RunAggregate | None]:
    """`admit_in_tx`, with the admitted Run as the commit leaves it (None: a replay).
    A `rerun` (docs/DESIGN.md "Reruns") names its source and reuses its steps.
    `at_commit`: the caller tries the whole unit again on a conflict, so the append may
    go with COMMIT (`projections.registry.commit_encoded`)."""
    admission_key, run_id = admission_identity(admission_key, run_id)
    reads = PublicationReads(tx, workflows)
    # what decides a replay or a taken run id (and, when this process resolved the
    # name before, the publication under its publisher's lock): one round trip
    first = reads.read_first(package, admission_key, run_id)
    publication = reads.resolve_and_serialize(package)

    receipt_stream = receipt_stream_id(admission_key)
    # a key whose Run retention removed has no receipt stream: its tombstone answers
    if first.heads[receipt_stream] or first.kept_receipt is not None:
        replayed = _exact_replay(
            tx, reads, publication, admission_key, run_id, workflow_key, timeout_ms, params,
            priority,
        )  # fmt: skip
        if replayed is not None:
            return replayed, None
    _refuse_taken_run_id(tx, run_id, admission_key, reads, first)

    _, revision = reads.published_revision(publication.publication_id)
    check_start(
        publication,
        reads.publisher_status(publication),
        reads.installation_head(publication),
        revision,
        workflow_key,
        superseded_ok=rerun is not None and rerun.same_plan,
    )
    plan = reads.plan(
        publication.publication_id, workflow_key, run_id, timeout_ms, params, priority
    )
    reuses: tuple[Reuse, ...] = ()
    if rerun is not None:
        reuses = reused_steps(rerun.source, plan, rerun.from_steps)
    decision = admission_records(
        plan,
        admission_key,
        now_ms,
        rerun.rerun_of if rerun else None,
        reuses,
        queued=_queues(tx, plan),
    )
    run_events = decision.events(run_stream(run_id))
    mutations = decision.events(steps_stream(run_id))
    mutation_of = {mutation.data["event_id"]: mutation.event_id for mutation in mutations}
    admitted_event = run_events[0]
    document = receipt_document(
        run_id=run_id,
        plan_digest=plan.plan_digest,
        admission_key=admission_key,
        package=plan.package,
        installation=plan.installation,
        workflow_key=workflow_key,
        publication_id=plan.publication_id,
        publication_digest=plan.publication_digest,
        admitted_event_id=admitted_event.event_id,
        steps=tuple(
            ReceiptStep(
                step_key=event.data["step_key"],
                step_run_id=event.data["step_run_id"],
                mutation_id=mutation_of[event.event_id],
                event_id=event.event_id,
            )
            for event in run_events[1:]
            if event.type == EventType.STEP_CREATED
        ),
        final_run_version=len(run_events),
        final_steps_version=len(mutations),
        admitted_at_ms=now_ms,
    )
    receipt_event = NewEvent(
        event_id=derive_id(RECEIPT, document["receipt_digest"]),
        type=read_model.RECEIPT,
        data=document,
        metadata={
            "at_ms": now_ms,
            "causation_id": admitted_event.event_id,
            "correlation_id": run_id,
            "actor": ADMISSION_ACTOR,
        },
    )
    receipt_append = StreamAppend(receipt_stream_id(admission_key), 0, (receipt_event,))
    carried, admitted = admit_and_claim(decision, run_id, now_ms, advance=bool(reuses))
    appends = [*carried.appends, receipt_append]
    folded = {run_id: admitted}
    if reads.definer:
        # least-privilege roles: the database checks the start guard again and is the
        # only way to write workflow.admitted (projections.admission_guard)
        commit_through(
            tx,
            admission_guard.ADMIT,
            (publication.publication_id, workflow_key),
            appends,
            folded=folded,
        )
    else:
        commit(tx, appends, folded=folded, at_commit=at_commit)
    return receipt_from_document(document, CREATED), admitted


def inspect_admission(
    reader: Reads, run_id: str | None = None, admission_key: str | None = None
) -> AdmissionReceipt | None:
    """The durable receipt by run id or admission key (both: must agree), else None.

    `reader` is a store or an open transaction. After an unknown commit outcome this
    is the recovery path: it never plans again and never makes new ids.
    """
    if run_id is None and admission_key is None:
        raise InvalidInput(
            "run_id", "required", "inspect_admission needs a run_id or an admission_key"
        )
    if admission_key is not None:
        if not isinstance(admission_key, str) or not admission_key:
            raise InvalidInput("admission_key", "text", "admission_key must be a non-empty string")
        receipt = receipt_of_key(reader, admission_key)
    else:
        if not isinstance(run_id, str) or not run_id:
            raise InvalidInput("run_id", "text", "run_id must be a non-empty string")
        found = read_model.receipt_stream_of_run(reader, run_id)
        records = reader.read_stream(found) if found is not None else []
        if records:
            receipt = with_tombstone(reader, receipt_from_document(records[0].data, EXISTING))
        else:
            receipt = retained.removed_receipt(reader, run_id=run_id)
    if receipt is None or (run_id is not None and receipt.run_id != run_id):
        return None
    return receipt


def receipt_of_key(reader: Reads, admission_key: str) -> AdmissionReceipt | None:
    """The receipt of `admission_key` ("existing"): its receipt stream's, or, when
    retention removed its Run with the stream, the one the Run's tombstone keeps
    (docs/DESIGN.md, "Retention"); None when the key admitted nothing."""
    records = reader.read_stream(receipt_stream_id(admission_key))
    if records:
        return with_tombstone(reader, receipt_from_document(records[0].data, EXISTING))
    # read after the stream: a batch that removed it committed its tombstone with it
    return retained.removed_receipt(reader, admission_key=admission_key)


def with_tombstone(reader: Reads, receipt: AdmissionReceipt) -> AdmissionReceipt:
    """`receipt`, saying when retention removed its Run if it did (docs/DESIGN.md,
    "Retention"): the key still answers "existing" with that Run, never a new one."""
    found = retained.tombstone(reader, receipt.run_id)
    if found is None:
        return receipt
    return replace(receipt, removed_at_ms=found["removed_at_ms"])


def published_revision(
    tx: Reads, publication_id: str
) -> tuple[PublicationRef, MaterializedRevision]:
    """The publication and the revision recorded in its `publication.published`
    event, both strictly re-read (a digest that does not match raises PlanError)."""
    records = tx.read_stream(PUBLICATION_STREAM + publication_id)
    return _revision_of(publication_id, records[0] if records else None)


def _revision_of(
    publication_id: str, record: Record | None
) -> tuple[PublicationRef, MaterializedRevision]:
    if record is None or record.type != read_model.PUBLISHED:
        raise CorruptionError(f"publication {publication_id!r} has no publication.published event")
    return publication_from_json(record.data["publication"]), revision_from_json(
        record.data["revision"]
    )


@dataclass(frozen=True, slots=True)
class FirstReads:
    """What `PublicationReads.read_first` read of the key and the run id: the heads
    of the receipt stream and of the Run's stream, the run id's tombstone and the
    receipt a tombstone keeps for the key."""

    heads: dict[str, int]
    tombstone: dict[str, Any] | None
    kept_receipt: AdmissionReceipt | None


class PublicationReads:
    """Admission's reads of publications, publisher trust and published revisions in
    one transaction: through `qlflow_admission_source` where the schema has it (a
    PostgreSQL runtime role may not read those tables), else from the read models."""

    def __init__(self, tx: Transaction, workflows: PlannedWorkflows | None = None) -> None:
        self._tx = tx
        self.definer = False  # read_first asks the schema
        self._sources: dict[str, admission_source.AdmissionSource] = {}
        self._workflows = workflows
        self._heads: dict[str, Publication] = {}  # resolved by name: the head itself
        # read_first: (run id, publisher, (receipt stream of the run, publisher status))
        self._checks: tuple[str, str | None, tuple[str | None, str | None]] | None = None
        # read_first: the publisher guessed and locked, and the heads read under its lock
        self._guessed: tuple[str, list[Publication]] | None = None

    def read_first(self, package: str, admission_key: str, run_id: str) -> FirstReads:
        """The reads admission starts with, sent together (one round trip on
        PostgreSQL): whether the schema has the admission source; the heads of the
        key's receipt stream and of the Run's stream, then the tombstones of both (in
        this order: a Run retention removes between the two reads is seen by one);
        the receipt stream of the run id; and, when this process resolved `package`
        before to a publisher (a guess, checked under its lock by
        `resolve_and_serialize`), that publisher's lock, then the heads named
        `package` and the publisher's status."""
        guess = None
        if self._workflows is not None and not package.startswith(PUBLICATION_ID):
            guess = self._workflows.publisher_of(package)
        if guess is not None:
            serialize_publisher(self._tx, guess, ahead=True)
        heads = self._tx.stream_versions_ahead(
            [receipt_stream_id(admission_key), run_stream(run_id)]
        )
        queries = [
            retained.admission_tombstones_query(run_id, admission_key),
            *read_model.admission_check_queries(run_id, guess),
        ]
        if guess is not None:
            queries += read_model.heads_named_queries(package)
        self._tx.read_ahead(queries)
        self.definer = admission_source.has_admission_source(self._tx)  # sends them all
        found = self._tx.query_all(queries)
        tombstone, kept = retained.admission_tombstones(found[0], run_id, admission_key)
        checks = 2 if guess is not None else 1
        self._checks = (run_id, guess, read_model.admission_checks_from(found[1 : 1 + checks]))
        if guess is not None:
            self._guessed = (guess, read_model.heads_named_from(*found[1 + checks :]))
        return FirstReads(heads(), tombstone, kept)

    def resolve_and_serialize(self, package: str) -> Publication:
        """Resolve the publication, lock its publisher, and resolve again under the
        lock (so a publish or revocation that committed meanwhile is seen)."""
        if not isinstance(package, str) or not package:
            raise InvalidInput(
                "package", "text", f"package must be a non-empty string, got {package!r}"
            )
        if self.definer:
            return _single(package, self._source(package).matches)
        locked: set[str] = set()
        if self._guessed is not None:  # read under the guessed publisher's lock
            guess, heads = self._guessed
            locked.add(guess)
            publication = self._resolve(package, heads)
        else:
            publication = self._resolve(package)
        while publication.publisher not in locked:
            serialize_publisher(self._tx, publication.publisher, ahead=True)  # then read
            locked.add(publication.publisher)
            publication = self._resolve(package)
        if self._workflows is not None and not package.startswith(PUBLICATION_ID):
            self._workflows.resolved(package, publication.publisher)
        return publication

    def publication(self, publication_id: str) -> Publication | None:
        """The publication `publication_id`, or None."""
        if self.definer:
            matches = self._source(publication_id).matches
            return next((p for p in matches if p.publication_id == publication_id), None)
        return read_model.publication(self._tx, publication_id)

    def published_revision(
        self, publication_id: str
    ) -> tuple[PublicationRef, MaterializedRevision]:
        """See `published_revision` (a revision a checked Workflow holds is not read
        again: it never changes)."""
        held = self._held(publication_id)
        if held is not None:
            return held.publication, held.revision
        if self.definer:
            return _revision_of(publication_id, self._source(publication_id).published)
        return published_revision(self._tx, publication_id)

    def plan(
        self,
        publication_id: str,
        workflow_key: str,
        run_id: str,
        timeout_ms: int | None,
        params: Mapping[str, Any] | None,
        priority: int | None = None,
    ) -> ExecutionPlan:
        """The plan of one Run of `workflow_key` of the publication (`build_plan`), the
        Workflow checked once per process (`PlannedWorkflows`)."""
        planned = None
        if self._workflows is not None:
            planned = self._workflows.get(publication_id, workflow_key)
        if planned is None:
            ref, revision = self.published_revision(publication_id)
            planned = plan_workflow(ref, revision, workflow_key)
            if self._workflows is not None:
                self._workflows.put(planned)
        ids = step_run_ids_for(run_id, [step.key for step in planned.workflow.steps])
        return bind_plan(planned, run_id, ids, timeout_ms, params, priority)

    def _held(self, publication_id: str) -> PlannedWorkflow | None:
        if self._workflows is None:
            return None
        return self._workflows.any_of(publication_id)

    def receipt_stream_of_run(self, run_id: str) -> str | None:
        """The receipt stream of the admission that created `run_id`, or None."""
        if self._checks is not None and self._checks[0] == run_id:
            return self._checks[2][0]
        return read_model.receipt_stream_of_run(self._tx, run_id)

    def publisher_status(self, publication: Publication) -> str | None:
        """The trust status of the publication's publisher ("revoked", "active", None)."""
        if self.definer:
            return self._source(publication.publication_id).publisher_status
        if self._checks is not None and self._checks[1] == publication.publisher:
            return self._checks[2][1]  # read under its lock (read_first)
        return read_model.publisher_status(self._tx, publication.publisher)

    def installation_head(self, publication: Publication) -> Publication | None:
        """The current head of the publication's installation."""
        if publication.publication_id in self._heads:
            return self._heads[publication.publication_id]  # read as the head, under the lock
        if self.definer:
            return self._source(publication.publication_id).head
        return read_model.installation_head(self._tx, publication.project, publication.installation)

    def _resolve(self, package: str, heads: list[Publication] | None = None) -> Publication:
        """`heads`: those named `package`, already read under the lock held."""
        self._heads.clear()
        if package.startswith(PUBLICATION_ID):  # no installation or package name has ":"
            explicit = read_model.publication(self._tx, package)
            if explicit is not None:
                return explicit
        if heads is None:
            heads = read_model.heads_named(self._tx, package)
        head = _single(package, heads)
        self._heads[head.publication_id] = head
        return head

    def _source(self, target: str) -> admission_source.AdmissionSource:
        source = self._sources.get(target)
        if source is None:
            source = admission_source.admission_source(self._tx, target)
            self._sources[target] = source
            if len(source.matches) == 1:
                self._sources.setdefault(source.matches[0].publication_id, source)
        return source


# --- steps of admission -----------------------------------------------------------------


def _single(package: str, heads: list[Publication] | tuple[Publication, ...]) -> Publication:
    if not heads:
        raise NotFound(f"no published package or installation {package!r}; publish it first")
    if len(heads) > 1:
        names = ", ".join(f"{head.project}/{head.installation}" for head in heads)
        raise InvalidInput(
            "package",
            "ambiguous",
            f"{package!r} names several installations ({names}); "
            "start one by its installation name or publication id",
        )
    return heads[0]


def _exact_replay(
    tx: Transaction,
    reads: PublicationReads,
    publication: Publication,
    admission_key: str,
    run_id: str,
    workflow_key: str,
    timeout_ms: int | None,
    params: Mapping[str, Any] | None,
    priority: int | None = None,
) -> AdmissionReceipt | None:
    receipt = receipt_of_key(tx, admission_key)
    if receipt is None:
        return None
    bound = reads.publication(receipt.publication_id)
    same_installation = bound is not None and (bound.project, bound.installation) == (
        publication.project,
        publication.installation,
    )
    digest = None
    if same_installation:
        try:
            plan = reads.plan(
                receipt.publication_id, workflow_key, run_id, timeout_ms, params, priority
            )
            digest = plan.plan_digest
        except PlanError:
            digest = None
    if digest == receipt.plan_digest:
        return receipt
    raise AdmissionCollision(
        f"admission key {admission_key!r} already admitted run {receipt.run_id!r} "
        f"({receipt.package} {receipt.workflow_key}, plan {receipt.plan_digest}); this request "
        "(package, workflow, run id, timeout, parameters or priority) gives a different plan. "
        "Use a new admission key, or inspect_admission(admission_key=...) to read the admitted Run"
    )


def _queues(tx: Transaction, plan: ExecutionPlan) -> bool:
    """Whether the Run waits in its Workflow's queue (docs/DESIGN.md "Flow control"):
    decided by `domain.slots.takes_slot_at_admission` under the slot's lock, on the
    Runs holding the slot and those queued ahead of it."""
    ref = plan.flow.run_slot
    if ref is None:
        return False
    tx.lock(slot_lock(ref.slot))
    facts = limit_rows.run_slot_facts(tx, ref.slot, ref.limit, plan.flow.priority)
    held = facts.held.get(ref.slot, 0)
    return not takes_slot_at_admission(ref, held, facts.queued_ahead, facts.overrides)


def _refuse_taken_run_id(
    tx: Transaction, run_id: str, admission_key: str, reads: PublicationReads, first: FirstReads
) -> None:
    stream = reads.receipt_stream_of_run(run_id)
    if stream is not None and stream == receipt_stream_id(admission_key):
        # this very key, admitted by a concurrent start that committed between the
        # pipeline's reads (each statement reads what was committed before it): not
        # a refusal; the next try's exact replay answers with that Run
        raise VersionConflict(stream, 0, 1)  # a receipt stream holds one receipt
    if stream is not None:
        receipt = receipt_from_document(tx.read_stream(stream)[0].data, EXISTING)
        raise AdmissionCollision(
            f"run id {run_id!r} was already admitted under admission key "
            f"{receipt.admission_key!r} (plan {receipt.plan_digest}), not {admission_key!r}; "
            "choose another run id, or leave it out to derive one from the admission key"
        )
    if first.heads[run_stream(run_id)] > 0:
        raise AdmissionCollision(f"run id {run_id!r} already has events; choose another run id")
    removed = first.tombstone
    if removed is not None:
        raise AdmissionCollision(
            f"run id {run_id!r} was admitted under admission key {removed['admission_key']!r} "
            f"and removed by retention; a run id is never used twice: choose another run id"
        )
