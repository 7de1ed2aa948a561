"""Value objects the public API returns: `Publication` and `AdmissionReceipt`.

Both are frozen and built from durable facts only (an event or a read-model row),
so the same facts always give an equal value. The receipt's digest is computed
here, purely, over the canonical JSON of its document.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.canonical import domain_digest
from domain.errors import CorruptionError
from domain.streams import ADMISSION, stream_id

RECEIPT_SCHEMA = "qlflow/admission-receipt@v1"
ADMISSION_KEY_DOMAIN = b"qlflow/admission-key@v1\x00"
CREATED = "created"
EXISTING = "existing"

ACTIVE = "active"
WITHDRAWN = "withdrawn"
QUARANTINED = "quarantined"
REVOKED = "revoked"  # a publisher's trust status (the other is ACTIVE)


@dataclass(frozen=True, slots=True)
class Publication:
    """A published revision of one package installation.

    `status` is active | withdrawn | quarantined; `head` says whether it is the
    current head (newest generation) of its installation; `created` is True only
    on the value `publish` returns when that call wrote it (False for a no-op).
    """

    publication_id: str
    package: str
    publisher: str
    generation: int
    revision_digest: str
    project: str
    installation: str
    revision_id: str
    publication_digest: str
    lock_digest: str
    workflows: tuple[str, ...]
    status: str
    head: bool
    published_at_ms: int
    created: bool = False


@dataclass(frozen=True, slots=True)
class ReceiptStep:
    """What admission wrote for one Step: its StepRun id, the `step.created` RunEvent
    id and the id of the StepRunMutation pointing at it."""

    step_key: str
    step_run_id: str
    mutation_id: str
    event_id: str


@dataclass(frozen=True, slots=True)
class AdmissionReceipt:
    """The durable answer of one admission (docs/DESIGN.md, "Durable admission").

    `status` is "created" when this call admitted the Run, "existing" when the
    admission key had already admitted exactly this plan (a replay).
    `final_run_version` and `final_steps_version` are the Run and StepRun stream
    versions after the admission's own records; the same commit goes on to claim an
    Attempt for each ready root step (`attempt.claimed`, as the cycle's attempt
    admission would), after them.
    """

    run_id: str
    plan_digest: str
    admission_key: str
    status: str
    receipt_digest: str
    package: str
    installation: str
    workflow_key: str
    publication_id: str
    publication_digest: str
    admitted_event_id: str
    steps: tuple[ReceiptStep, ...]
    final_run_version: int
    final_steps_version: int
    admitted_at_ms: int
    # when retention removed the Run (docs/DESIGN.md "Retention"); not in the document
    removed_at_ms: int | None = None

    @property
    def removed(self) -> str | None:
        """ "removed by retention at <UTC time>" for a Run retention removed, else None."""
        if self.removed_at_ms is None:
            return None
        return f"removed by retention at {utc_text(self.removed_at_ms)}"

    def document(self) -> dict[str, Any]:
        """The receipt document as stored in its `admission.receipt` event."""
        return receipt_document(
            run_id=self.run_id,
            plan_digest=self.plan_digest,
            admission_key=self.admission_key,
            package=self.package,
            installation=self.installation,
            workflow_key=self.workflow_key,
            publication_id=self.publication_id,
            publication_digest=self.publication_digest,
            admitted_event_id=self.admitted_event_id,
            steps=self.steps,
            final_run_version=self.final_run_version,
            final_steps_version=self.final_steps_version,
            admitted_at_ms=self.admitted_at_ms,
        )


def receipt_stream_id(admission_key: str) -> str:
    """The receipt stream of an admission key: the admission category and 64 hex digits
    of a domain-separated SHA-256, so any key (any length, any character) fits a stream id."""
    digest = hashlib.sha256(ADMISSION_KEY_DOMAIN + admission_key.encode("utf-8")).hexdigest()
    return stream_id(ADMISSION, digest)


def receipt_document(
    *,
    run_id: str,
    plan_digest: str,
    admission_key: str,
    package: str,
    installation: str,
    workflow_key: str,
    publication_id: str,
    publication_digest: str,
    admitted_event_id: str,
    steps: tuple[ReceiptStep, ...],
    final_run_version: int,
    final_steps_version: int,
    admitted_at_ms: int,
) -> dict[str, Any]:
    """The canonical receipt document, `receipt_digest` included (computed here)."""
    document: dict[str, Any] = {
        "schema": RECEIPT_SCHEMA,
        "run_id": run_id,
        "plan_digest": plan_digest,
        "admission_key": admission_key,
        "package": package,
        "installation": installation,
        "workflow_key": workflow_key,
        "publication_id": publication_id,
        "publication_digest": publication_digest,
        "admitted_event_id": admitted_event_id,
        "steps": [
            {
                "step_key": step.step_key,
                "step_run_id": step.step_run_id,
                "mutation_id": step.mutation_id,
                "event_id": step.event_id,
            }
            for step in steps
        ],
        "final_run_version": final_run_version,
        "final_steps_version": final_steps_version,
        "admitted_at_ms": admitted_at_ms,
    }
    document["receipt_digest"] = domain_digest(RECEIPT_SCHEMA, document)
    return document


def receipt_from_document(document: Mapping[str, Any], status: str) -> AdmissionReceipt:
    """Rebuild a receipt from its stored document, checking its digest."""
    try:
        receipt = AdmissionReceipt(
            run_id=document["run_id"],
            plan_digest=document["plan_digest"],
            admission_key=document["admission_key"],
            status=status,
            receipt_digest=document["receipt_digest"],
            package=document["package"],
            installation=document["installation"],
            workflow_key=document["workflow_key"],
            publication_id=document["publication_id"],
            publication_digest=document["publication_digest"],
            admitted_event_id=document["admitted_event_id"],
            steps=tuple(
                ReceiptStep(
                    step_key=step["step_key"],
                    step_run_id=step["step_run_id"],
                    mutation_id=step["mutation_id"],
                    event_id=step["event_id"],
                )
                for step in document["steps"]
            ),
            final_run_version=document["final_run_version"],
            final_steps_version=document["final_steps_version"],
            admitted_at_ms=document["admitted_at_ms"],
        )
    except (KeyError, TypeError) as error:
        raise CorruptionError(f"admission receipt document is malformed: {error!r}") from None
    if receipt.document() != dict(document):
        raise CorruptionError(
            f"admission receipt of run {receipt.run_id!r} does not match its digest "
            f"{receipt.receipt_digest!r}"
        )
    return receipt


def utc_text(at_ms: int) -> str:
    """Epoch ms as "YYYY-MM-DD HH:MM:SS UTC"."""
    moment = datetime.datetime.fromtimestamp(at_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
