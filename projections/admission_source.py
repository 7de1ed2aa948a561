"""The admission source: what admission may know about publications where the
runtime role may not read their tables (least-privilege roles, `actors.roles`).

`qlflow_admission_source(target)` is a SECURITY DEFINER function (declared in
`FUNCTIONS`, installed by the role setup, owned by the admission role) that resolves
a target to its publication, takes that publisher's lock, and answers with the
publication, its publisher's trust status, the head of its installation and its
`publication.published` record, all from the read models of
`projections.publications` (whose row parser reads its answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from domain import streams
from domain.errors import SchemaError
from domain.records import Record
from domain.values import Publication
from eventstore.api import Transaction
from eventstore.grants import ADMISSION, OWNER, RUNTIME, ServerFunction
from eventstore.locks import LOCK_TABLE, lock_bucket
from eventstore.validation import record_from_row
from projections.publications import (
    PUBLICATION_COLUMNS,
    PUBLISHER_LOCK_PREFIX,
    publication_from_row,
)

ADMISSION_SOURCE = "qlflow_admission_source"
_ADMISSION_SOURCE_VERSION = (
    "qlflow admission source v4 (publisher lock: a qlflow_locks row, as store.lock)"
)
_PUBLISHED_PREFIX = streams.prefix(streams.PUBLICATION)
# What admission may know about the publication a request names, read under the
# publisher's lock: the same lock, by the same name and key, as `publisher_lock`
# taken through `Transaction.lock`, so admission and revocation still exclude each
# other. Resolution follows actors.admission: an explicit publication id, else the
# heads of the installation named so, else the heads of the package named so.
_ADMISSION_SOURCE_BODY = f"""
DECLARE
    matches jsonb;
    chosen jsonb;
    publisher_name text;
    locked text[] := ARRAY[]::text[];
BEGIN
    LOOP
        SELECT coalesce(jsonb_agg(to_jsonb(p)), '[]'::jsonb) INTO matches
        FROM (SELECT {PUBLICATION_COLUMNS} FROM publications WHERE publication_id = target) p;
        IF jsonb_array_length(matches) = 0 THEN
            SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.project, p.installation),
                            '[]'::jsonb) INTO matches
            FROM (SELECT {PUBLICATION_COLUMNS} FROM publications
                  WHERE installation = target AND head = 1) p;
        END IF;
        IF jsonb_array_length(matches) = 0 THEN
            SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.project, p.installation),
                            '[]'::jsonb) INTO matches
            FROM (SELECT {PUBLICATION_COLUMNS} FROM publications
                  WHERE package = target AND head = 1) p;
        END IF;
        IF jsonb_array_length(matches) <> 1 THEN
            RETURN jsonb_build_object('matches', matches);
        END IF;
        publisher_name := matches -> 0 ->> 'publisher';
        EXIT WHEN publisher_name = ANY (locked);
        -- lock, then resolve again: a publish or revocation may have committed meanwhile
        PERFORM 1 FROM {LOCK_TABLE}
        WHERE bucket = {lock_bucket(f"'{PUBLISHER_LOCK_PREFIX}' || publisher_name")} FOR UPDATE;
        locked := locked || publisher_name;
    END LOOP;
    chosen := matches -> 0;
    RETURN jsonb_build_object(
        'matches', matches,
        'publisher_status',
            (SELECT status FROM publishers WHERE publisher = publisher_name),
        'head',
            (SELECT to_jsonb(p) FROM (SELECT {PUBLICATION_COLUMNS} FROM publications
                WHERE project = chosen ->> 'project'
                  AND installation = chosen ->> 'installation' AND head = 1) p),
        'published',
            (SELECT jsonb_build_array(global_position, event_id, stream_id, stream_version,
                                      type, data, metadata)
             FROM events WHERE stream_id = '{_PUBLISHED_PREFIX}' || (chosen ->> 'publication_id')
             ORDER BY stream_version LIMIT 1));
END
"""
FUNCTIONS = (
    ServerFunction(
        name=ADMISSION_SOURCE,
        parameters=(("target", "text"),),
        returns="jsonb",
        body=_ADMISSION_SOURCE_BODY,
        owner=ADMISSION,
        executors=(OWNER, RUNTIME),
        comment=_ADMISSION_SOURCE_VERSION,
    ),
)


@dataclass(frozen=True, slots=True)
class AdmissionSource:
    """What `qlflow_admission_source` answered for one target: the publications it
    names (one; none when unknown; several when ambiguous) and, for exactly one, its
    publisher's trust status, the current head of its installation and its
    `publication.published` record."""

    matches: tuple[Publication, ...]
    publisher_status: str | None = None
    head: Publication | None = None
    published: Record | None = None


def has_admission_source(tx: Transaction) -> bool:
    """Whether the schema of `tx` routes admission through `qlflow_admission_source`
    (least-privilege roles set up); SchemaError when the function installed predates
    this qlflow (its lock would not exclude revocation: set the roles up again)."""
    comment = tx.function_comment(FUNCTIONS[0].signature)
    if comment is None:
        return False
    if comment != _ADMISSION_SOURCE_VERSION:
        raise SchemaError(
            f"{ADMISSION_SOURCE} was installed by an older qlflow ({comment or 'no version'}); "
            "run `qlflow pg-roles` again (as a superuser) before starting Workflows"
        )
    return True


def admission_source(tx: Transaction, target: str) -> AdmissionSource:
    """Ask `qlflow_admission_source` about `target` (a publication id, installation or
    package name) inside the transaction `tx`. When it names exactly one publication,
    the call has also taken that publisher's lock for the transaction."""
    document = tx.call(ADMISSION_SOURCE, (target,))
    if isinstance(document, str | bytes):
        document = orjson.loads(document)
    published = document.get("published")
    return AdmissionSource(
        matches=tuple(_publication_of(row) for row in document["matches"]),
        publisher_status=document.get("publisher_status"),
        head=_publication_of(document["head"]) if document.get("head") else None,
        published=record_from_row(published) if published else None,
    )


_COLUMN_NAMES = tuple(name.strip() for name in PUBLICATION_COLUMNS.split(","))


def _publication_of(row: Mapping[str, Any]) -> Publication:
    """A publication from the JSON object of a publications row."""
    return publication_from_row(tuple(row[name] for name in _COLUMN_NAMES))
