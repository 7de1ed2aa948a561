"""Read models of publications, publishers and admission receipts.

Folded from the `publication-`, `publisher-` and `admission-` streams (see
docs/EVENTS.md), in the append's transaction. The head of an installation is its
newest generation, whatever its status: a withdrawn or quarantined head blocks
starts until a new generation is published; starts never fall back to an older
generation. The readers take a store or an open transaction.

Where least-privilege roles are set up (`actors.roles`), the runtime may not read
these tables: admission asks the SECURITY DEFINER function of
`projections.admission_source` instead, which answers from the same tables, parses
rows with `publication_from_row` and takes the same publisher lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from domain import streams
from domain.event_types import EventType
from domain.records import Record
from domain.values import ACTIVE, QUARANTINED, REVOKED, WITHDRAWN, Publication
from eventstore.api import Reads, Transaction
from eventstore.grants import (
    ADMISSION,
    AUDIT,
    MOVE,
    PUBLISHER,
    READ,
    RUNTIME,
)
from projections.contract import Folded, Insert

COMPONENT = "projections.publications"
STREAM_PREFIXES = tuple(
    streams.prefix(c) for c in (streams.PUBLICATION, streams.PUBLISHER, streams.ADMISSION)
)

PUBLISHED = EventType.PUBLICATION_PUBLISHED
PUBLICATION_WITHDRAWN = EventType.PUBLICATION_WITHDRAWN
PUBLICATION_QUARANTINED = EventType.PUBLICATION_QUARANTINED
PUBLISHER_REVOKED = EventType.PUBLISHER_REVOKED
PUBLISHER_REINSTATED = EventType.PUBLISHER_REINSTATED
RECEIPT = EventType.ADMISSION_RECEIPT
PUBLISHER_LOCK_PREFIX = "qlflow-publisher:"

MIGRATIONS = [
    {
        "sqlite": [
            """CREATE TABLE publications (
                publication_id TEXT PRIMARY KEY,
                project TEXT NOT NULL,
                package TEXT NOT NULL,
                installation TEXT NOT NULL,
                publisher TEXT NOT NULL,
                generation INTEGER NOT NULL,
                revision_id TEXT NOT NULL,
                revision_digest TEXT NOT NULL,
                publication_digest TEXT NOT NULL,
                lock_digest TEXT NOT NULL,
                workflows TEXT NOT NULL,
                withdrawn INTEGER NOT NULL DEFAULT 0,
                quarantined INTEGER NOT NULL DEFAULT 0,
                status TEXT NOT NULL,
                head INTEGER NOT NULL,
                published_at_ms INTEGER NOT NULL,
                status_changed_at_ms INTEGER,
                UNIQUE (project, installation, generation)
            )""",
            "CREATE INDEX publications_heads_by_package ON publications (package) WHERE head = 1",
            """CREATE INDEX publications_heads_by_installation ON publications (installation)
                WHERE head = 1""",
            """CREATE TABLE publishers (
                publisher TEXT PRIMARY KEY,
                status TEXT NOT NULL,
                changed_at_ms INTEGER,
                reason TEXT
            )""",
            """CREATE TABLE admission_receipts (
                receipt_stream TEXT PRIMARY KEY,
                admission_key TEXT NOT NULL,
                run_id TEXT NOT NULL UNIQUE,
                plan_digest TEXT NOT NULL,
                receipt_digest TEXT NOT NULL,
                package TEXT NOT NULL,
                workflow_key TEXT NOT NULL,
                publication_id TEXT NOT NULL,
                admitted_at_ms INTEGER NOT NULL
            )""",
        ],
    }
]
# PostgreSQL takes the same DDL with BIGINT for the integer columns.
MIGRATIONS[0]["postgresql"] = [
    stmt.replace("INTEGER", "BIGINT") for stmt in MIGRATIONS[0]["sqlite"]
]

TABLES = {
    "publications": ("publication_id",),
    "publishers": ("publisher",),
    "admission_receipts": ("receipt_stream",),
}
backfill = None  # nothing to fill after an upgrade
reads_ahead = None  # apply reads nothing worth sending ahead
reads_ahead_of_runs = None
GRANTS = {
    "publications": {ADMISSION: READ, PUBLISHER: MOVE, AUDIT: READ},
    "publishers": {ADMISSION: READ, PUBLISHER: MOVE, AUDIT: READ},
    "admission_receipts": {RUNTIME: ("SELECT", "INSERT"), AUDIT: READ},
}

PUBLICATION_COLUMNS = (
    "publication_id, package, publisher, generation, revision_digest, project, installation, "
    "revision_id, publication_digest, lock_digest, workflows, status, head, published_at_ms"
)


def publisher_lock(publisher: str) -> str:
    """The name of the lock that serializes admission against a change of what
    `publisher` may start (revocation, publishing, withdrawal, quarantine)."""
    return PUBLISHER_LOCK_PREFIX + publisher


def apply(tx: Transaction, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Fold freshly appended publication, publisher and receipt records."""
    for record in records:
        kind = record.type
        if kind == PUBLISHED:
            _published(tx, record)
        elif kind in (PUBLICATION_WITHDRAWN, PUBLICATION_QUARANTINED):
            _flagged(tx, record)
        elif kind in (PUBLISHER_REVOKED, PUBLISHER_REINSTATED):
            _publisher(tx, record)
        elif kind == RECEIPT:
            _receipt(tx, record)


_RECEIPT_COLUMNS = (
    "receipt_stream", "admission_key", "run_id", "plan_digest", "receipt_digest", "package",
    "workflow_key", "publication_id", "admitted_at_ms",
)  # fmt: skip


class Replay:
    """`apply` for a rebuild: receipts (one per Run, and nothing else reads their table)
    go in by one bulk `insert` per batch; every other record through `apply`."""

    def __init__(self, tx: Transaction, insert: Insert) -> None:
        self._tx = tx
        self._insert = insert

    def apply(self, records: Sequence[Record]) -> None:
        apply(self._tx, [record for record in records if record.type != RECEIPT])
        receipts = [_receipt_values(r) for r in records if r.type == RECEIPT]
        if receipts:
            self._insert("admission_receipts", _RECEIPT_COLUMNS, receipts)

    def flush(self) -> None:
        """Nothing is held back."""


def _receipt_values(record: Record) -> tuple[Any, ...]:
    data = record.data
    return (record.stream_id, *(data[column] for column in _RECEIPT_COLUMNS[1:]))


def _published(tx: Transaction, record: Record) -> None:
    ref = record.data["publication"]
    tx.execute(
        f"""INSERT INTO publications ({PUBLICATION_COLUMNS})
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)""",
        (
            ref["publication_id"],
            ref["package"],
            ref["publisher"],
            ref["generation"],
            ref["revision_digest"],
            ref["project"],
            ref["installation"],
            ref["revision_id"],
            ref["publication_digest"],
            ref["lock_digest"],
            ",".join(sorted(ref["workflow_digests"])),
            ACTIVE,
            record.data["published_at_ms"],
        ),
    )
    # The head is the newest generation of the installation.
    tx.execute(
        "UPDATE publications SET head = 0 WHERE project = ? AND installation = ? AND head = 1",
        (ref["project"], ref["installation"]),
    )
    tx.execute(
        """UPDATE publications SET head = 1 WHERE publication_id = (
               SELECT publication_id FROM publications WHERE project = ? AND installation = ?
               ORDER BY generation DESC LIMIT 1)""",
        (ref["project"], ref["installation"]),
    )


def _flagged(tx: Transaction, record: Record) -> None:
    column = "withdrawn" if record.type == PUBLICATION_WITHDRAWN else "quarantined"
    publication_id = record.data["publication_id"]
    tx.execute(
        f"UPDATE publications SET {column} = 1, status_changed_at_ms = ? WHERE publication_id = ?",
        (record.data["at_ms"], publication_id),
    )
    # Quarantine (a safety verdict) outranks withdrawal (a lifecycle decision).
    tx.execute(
        """UPDATE publications SET status = CASE WHEN quarantined = 1 THEN ?
               WHEN withdrawn = 1 THEN ? ELSE ? END WHERE publication_id = ?""",
        (QUARANTINED, WITHDRAWN, ACTIVE, publication_id),
    )


def _publisher(tx: Transaction, record: Record) -> None:
    status = REVOKED if record.type == PUBLISHER_REVOKED else ACTIVE
    publisher = record.data["publisher"]
    params = (status, record.data["at_ms"], record.data.get("reason"), publisher)
    if tx.query("SELECT 1 FROM publishers WHERE publisher = ?", (publisher,)):
        tx.execute(
            "UPDATE publishers SET status = ?, changed_at_ms = ?, reason = ? WHERE publisher = ?",
            params,
        )
    else:
        tx.execute(
            "INSERT INTO publishers (status, changed_at_ms, reason, publisher) VALUES (?, ?, ?, ?)",
            params,
        )


def _receipt(tx: Transaction, record: Record) -> None:
    # executemany answers nothing: a store may send it with the next statement
    tx.executemany(
        f"INSERT INTO admission_receipts ({', '.join(_RECEIPT_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(_RECEIPT_COLUMNS))})",
        [_receipt_values(record)],
    )


# --- readers ----------------------------------------------------------------------------


def publication(reader: Reads, publication_id: str) -> Publication | None:
    """The publication `publication_id`, or None."""
    rows = reader.query(
        f"SELECT {PUBLICATION_COLUMNS} FROM publications WHERE publication_id = ?",
        (publication_id,),
    )
    return publication_from_row(rows[0]) if rows else None


def installation_head(reader: Reads, project: str, installation: str) -> Publication | None:
    """The head (newest generation) of one installation, or None."""
    rows = reader.query(
        f"""SELECT {PUBLICATION_COLUMNS} FROM publications
            WHERE project = ? AND installation = ? AND head = 1""",
        (project, installation),
    )
    return publication_from_row(rows[0]) if rows else None


def heads_named(reader: Reads, name: str) -> list[Publication]:
    """Heads whose installation is `name`; if there are none, heads of package `name`.
    Sorted by project and installation."""
    by_installation, by_package = heads_named_queries(name)
    found = heads_named_from(reader.query(*by_installation), [])
    return found or heads_named_from([], reader.query(*by_package))


def heads_named_queries(name: str) -> list[tuple[str, list[Any]]]:
    """The two queries of `heads_named` (by installation, by package), to send at once
    (`Transaction.read_ahead`); `heads_named_from` answers from their rows."""
    return [
        (
            f"""SELECT {PUBLICATION_COLUMNS} FROM publications
                WHERE {column} = ? AND head = 1 ORDER BY project, installation""",
            [name],
        )
        for column in ("installation", "package")
    ]


def heads_named_from(
    by_installation: Sequence[Sequence[Any]], by_package: Sequence[Sequence[Any]]
) -> list[Publication]:
    """`heads_named` from the rows of its two queries: by installation if any."""
    return [publication_from_row(row) for row in by_installation or by_package]


def publications(reader: Reads, package: str | None = None) -> list[Publication]:
    """Every publication (of one package name, if given), oldest generation first."""
    where, params = ("WHERE package = ?", (package,)) if package is not None else ("", ())
    rows = reader.query(
        f"""SELECT {PUBLICATION_COLUMNS} FROM publications {where}
            ORDER BY project, installation, generation""",
        params,
    )
    return [publication_from_row(row) for row in rows]


def publisher_status(reader: Reads, publisher: str) -> str | None:
    """ "active" or "revoked" for a publisher with a trust event; None for one without."""
    rows = reader.query(_PUBLISHER_STATUS, (publisher,))
    return rows[0][0] if rows else None


def publisher_known(reader: Reads, publisher: str) -> bool:
    """Whether `publisher` ever published or had a trust event."""
    if publisher_status(reader, publisher) is not None:
        return True
    return bool(reader.query("SELECT 1 FROM publications WHERE publisher = ?", (publisher,)))


def admission_checks(
    reader: Reads, run_id: str, publisher: str | None
) -> tuple[str | None, str | None]:
    """(`receipt_stream_of_run(run_id)`, `publisher_status(publisher)` — None without
    a publisher) in one round trip."""
    return admission_checks_from(reader.query_all(admission_check_queries(run_id, publisher)))


def admission_checks_from(
    found: Sequence[Sequence[Sequence[Any]]],
) -> tuple[str | None, str | None]:
    """`admission_checks` from the rows of its queries (`admission_check_queries`)."""
    stream = found[0][0][0] if found[0] else None
    status = found[1][0][0] if len(found) > 1 and found[1] else None
    return stream, status


def admission_check_queries(run_id: str, publisher: str | None) -> list[tuple[str, list[Any]]]:
    """The queries of `admission_checks` (to read them ahead: `Transaction.read_ahead`)."""
    queries: list[tuple[str, list[Any]]] = [(_RECEIPT_OF_RUN, [run_id])]
    if publisher is not None:
        queries.append((_PUBLISHER_STATUS, [publisher]))
    return queries


_RECEIPT_OF_RUN = "SELECT receipt_stream FROM admission_receipts WHERE run_id = ?"
_PUBLISHER_STATUS = "SELECT status FROM publishers WHERE publisher = ?"


def receipt_stream_of_run(reader: Reads, run_id: str) -> str | None:
    """The receipt stream of the admission that created `run_id`, or None."""
    rows = reader.query(_RECEIPT_OF_RUN, (run_id,))
    return rows[0][0] if rows else None


def publication_from_row(row: Sequence[Any]) -> Publication:
    """A Publication from a publications row (columns in PUBLICATION_COLUMNS order):
    the one parser of that row."""
    (
        publication_id,
        package,
        publisher,
        generation,
        revision_digest,
        project,
        installation,
        revision_id,
        publication_digest,
        lock_digest,
        workflows,
        status,
        head,
        published_at_ms,
    ) = row
    return Publication(
        publication_id=publication_id,
        package=package,
        publisher=publisher,
        generation=int(generation),
        revision_digest=revision_digest,
        project=project,
        installation=installation,
        revision_id=revision_id,
        publication_digest=publication_digest,
        lock_digest=lock_digest,
        workflows=tuple(workflows.split(",")) if workflows else (),
        status=status,
        head=bool(head),
        published_at_ms=int(published_at_ms),
    )
