"""Publishing, withdrawal, quarantine and publisher trust, as transaction functions.

Each `*_in_tx` function runs inside a transaction the caller opened (usually
through the operation authority) and writes through `projections.registry.commit`,
so the events and the read models change together or not at all.

Serialization. Admission must never interleave with a change of what may start
(docs/DESIGN.md "Durable admission"). These functions and admission take the store's lock
on the publisher (`serialize_publisher`), and publishing also one on the
installation first, so two publishes of one installation cannot both take the
same next generation. Lock order is always installation, then publisher. (On
SQLite every write transaction holds the write lock already, and these locks cost
nothing.)

Every function is safe to call again after an unknown commit outcome: what was
already done is found in the read models and returned without a write.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from domain import streams
from domain.errors import InvalidInput, NotFound
from domain.ids import PUBLICATION_EVENT, PUBLISHER_EVENT, derive_id
from domain.publication import publication_for, publication_to_json
from domain.records import NewEvent, StreamAppend
from domain.revision import MaterializedRevision, materialize_revision, revision_to_json
from domain.values import REVOKED, Publication
from eventstore.api import Transaction
from projections import publications as read_model
from projections.registry import commit

PUBLICATION_STREAM = streams.prefix(streams.PUBLICATION)
PUBLISHER_STREAM = streams.prefix(streams.PUBLISHER)


def serialize_publisher(tx: Transaction, publisher: str, ahead: bool = False) -> None:
    """Take the serialization boundary shared by admission and publisher revocation:
    the publisher's lock, held until `tx` ends (the SECURITY DEFINER admission source
    takes the same lock by the same name). `ahead`: taken by the next statement, in
    its round trip (`Transaction.lock_ahead`), for a caller whose next step reads."""
    if ahead:
        tx.lock_ahead([read_model.publisher_lock(publisher)], [])
    else:
        tx.lock(read_model.publisher_lock(publisher))


def serialize_installation(tx: Transaction, project: str, installation: str) -> None:
    """Serialize publishing into one installation."""
    tx.lock(f"qlflow-installation:{project}/{installation}")


def publish_in_tx(
    tx: Transaction, package: Any, now_ms: int, *, publisher: str | None = None
) -> Publication:
    """Publish a package: `package` is a loaded package (with `.revision` and
    `.publisher`) or a MaterializedRevision (then give `publisher`).

    If the installation's head already holds the same content from the same
    publisher, nothing is written and the head is returned (`created` False), even
    when that head is withdrawn or quarantined. Otherwise the revision is
    re-materialized at the next generation (head + 1, or 1), published, and becomes
    the head; the older generation stops being head. A revoked publisher may not
    publish (InvalidInput, rule "revoked").
    """
    revision, publisher = _revision_and_publisher(package, publisher)
    serialize_installation(tx, revision.project, revision.installation)
    serialize_publisher(tx, publisher)
    if read_model.publisher_status(tx, publisher) == REVOKED:
        raise InvalidInput(
            "publisher",
            "revoked",
            f"publisher {publisher!r} is revoked and may not publish; reinstate it first",
        )
    head = read_model.installation_head(tx, revision.project, revision.installation)
    if (
        head is not None
        and head.lock_digest == revision.lock_digest
        and head.publisher == publisher
        and head.package == revision.package
    ):
        return head
    generation = head.generation + 1 if head is not None else 1
    revision = materialize_revision(
        revision.project,
        revision.package,
        revision.installation,
        generation,
        revision.tasks,
        revision.workflows,
    )
    ref = publication_for(revision, publisher)
    event = NewEvent(
        event_id=derive_id(PUBLICATION_EVENT, ref.publication_id, "published"),
        type=read_model.PUBLISHED,
        data={
            "publication": publication_to_json(ref),
            "revision": revision_to_json(revision),
            "published_at_ms": now_ms,
            # where the executor finds the files; not part of any digest
            "source_path": _source_path(package),
        },
        metadata=_metadata(now_ms, ref.publication_id),
    )
    commit(tx, [StreamAppend(PUBLICATION_STREAM + ref.publication_id, 0, (event,))])
    published = read_model.publication(tx, ref.publication_id)
    assert published is not None  # the commit above inserted it
    return _with_created(published)


def _source_path(package: Any) -> str | None:
    folder = getattr(package, "folder", None)
    return str(folder) if folder is not None else None


def withdraw_in_tx(
    tx: Transaction, publication_id: str, now_ms: int, reason: str | None = None
) -> Publication:
    """Withdraw a publication: it may start no new Workflow (admitted Runs finish on
    their own revision). Idempotent: withdrawing again writes nothing."""
    return _flag(tx, publication_id, now_ms, read_model.PUBLICATION_WITHDRAWN, reason)


def quarantine_in_tx(
    tx: Transaction, publication_id: str, now_ms: int, reason: str | None = None
) -> Publication:
    """Quarantine a publication: it may start no new Workflow. Idempotent."""
    return _flag(tx, publication_id, now_ms, read_model.PUBLICATION_QUARANTINED, reason)


def revoke_publisher_in_tx(
    tx: Transaction, publisher: str, now_ms: int, reason: str | None = None
) -> bool:
    """Revoke a publisher: none of its publications may start a Workflow from now on.

    Takes the same boundary as admission, so every admission either committed
    before the revocation or sees it and is refused. Returns False (no write) when
    the publisher is already revoked; NotFound for a publisher never seen.
    """
    return _trust(tx, publisher, now_ms, read_model.PUBLISHER_REVOKED, reason)


def reinstate_publisher_in_tx(
    tx: Transaction, publisher: str, now_ms: int, reason: str | None = None
) -> bool:
    """Trust a revoked publisher again. Returns False (no write) when it is not revoked."""
    return _trust(tx, publisher, now_ms, read_model.PUBLISHER_REINSTATED, reason)


def _flag(
    tx: Transaction, publication_id: str, now_ms: int, kind: str, reason: str | None
) -> Publication:
    found = read_model.publication(tx, publication_id)
    if found is None:
        raise NotFound(
            f"no publication {publication_id!r}; `qlflow publish` prints the ids it creates"
        )
    serialize_publisher(tx, found.publisher)
    stream = PUBLICATION_STREAM + publication_id
    history = tx.read_stream(stream)
    if any(record.type == kind for record in history):
        return found
    event = NewEvent(
        event_id=derive_id(PUBLICATION_EVENT, publication_id, kind),
        type=kind,
        data={"publication_id": publication_id, "at_ms": now_ms, "reason": reason},
        metadata=_metadata(now_ms, publication_id),
    )
    commit(tx, [StreamAppend(stream, len(history), (event,))])
    changed = read_model.publication(tx, publication_id)
    assert changed is not None
    return changed


def _trust(tx: Transaction, publisher: str, now_ms: int, kind: str, reason: str | None) -> bool:
    serialize_publisher(tx, publisher)
    if not read_model.publisher_known(tx, publisher):
        raise NotFound(f"no publisher {publisher!r} has published anything")
    status = read_model.publisher_status(tx, publisher)
    revoking = kind == read_model.PUBLISHER_REVOKED
    if (status == REVOKED) == revoking:
        return False
    stream = PUBLISHER_STREAM + publisher
    version = tx.stream_versions([stream])[stream]
    event = NewEvent(
        event_id=derive_id(PUBLISHER_EVENT, publisher, kind, version + 1),
        type=kind,
        data={"publisher": publisher, "at_ms": now_ms, "reason": reason},
        metadata=_metadata(now_ms, publisher),
    )
    commit(tx, [StreamAppend(stream, version, (event,))])
    return True


def _revision_and_publisher(
    package: Any, publisher: str | None
) -> tuple[MaterializedRevision, str]:
    revision: Any
    if isinstance(package, MaterializedRevision):
        revision = package
    else:
        revision = getattr(package, "revision", None)
        publisher = publisher or getattr(package, "publisher", None)
    if not isinstance(revision, MaterializedRevision):
        raise InvalidInput(
            "package",
            "type",
            "publish needs a loaded package or a MaterializedRevision, "
            f"not {type(package).__name__}",
        )
    if not isinstance(publisher, str) or not publisher:
        raise InvalidInput("publisher", "required", "publishing a revision needs its publisher")
    return revision, publisher


def _with_created(publication: Publication) -> Publication:
    return replace(publication, created=True)


def _metadata(now_ms: int, correlation_id: str) -> dict[str, Any]:
    return {
        "at_ms": now_ms,
        "causation_id": None,
        "correlation_id": correlation_id,
        "actor": "user",
    }
