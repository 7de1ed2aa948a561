"""The published revisions a worker needs, where its role may not read publications.

A worker resolves a lease to its Task from the revision its Run's publication
published. The runtime role of a least-privilege deployment reads neither the
publications table nor the `publication-` streams, so it asks
`qlflow_published_revisions(package, publication)`, a SECURITY DEFINER function owned
by the admission role, which answers only the `publication.published` data (the
revision and where it was published from) of the publications of one package or of
one publication id. Without the roles (SQLite, an owner) the same answer is read
from the read model and the log directly.
"""

from __future__ import annotations

from typing import Any

import orjson

from domain.event_types import EventType
from domain.streams import publication_stream
from eventstore.grants import ADMISSION, OWNER, RUNTIME, ServerFunction
from projections import publications

PUBLISHED_REVISIONS = "qlflow_published_revisions"
_VERSION = "qlflow published revisions v1"

_BODY = f"""
BEGIN
    RETURN (
        SELECT coalesce(jsonb_agg(jsonb_build_array(p.publication_id, e.data::jsonb)
                                  ORDER BY p.project, p.installation, p.generation),
                        '[]'::jsonb)
        FROM publications p
        JOIN LATERAL (SELECT data FROM events
                      WHERE stream_id = 'publication-' || p.publication_id
                        AND type = '{EventType.PUBLICATION_PUBLISHED}'
                      ORDER BY stream_version LIMIT 1) e ON true
        WHERE p.package = package_name OR p.publication_id = publication);
END
"""

FUNCTIONS = (
    ServerFunction(
        name=PUBLISHED_REVISIONS,
        parameters=(("package_name", "text"), ("publication", "text")),
        returns="jsonb",
        body=_BODY,
        owner=ADMISSION,
        executors=(OWNER, RUNTIME),
        comment=_VERSION,
    ),
)


def published_revisions(
    store: Any, *, package: str | None = None, publication_id: str | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """(publication id, `publication.published` data) of every publication of
    `package` (oldest generation first) or of the one `publication_id`."""
    with store.session() as session:
        if session.function_comment(FUNCTIONS[0].signature) is not None:
            document = session.call(PUBLISHED_REVISIONS, (package, publication_id))
            if isinstance(document, str | bytes):
                document = orjson.loads(document)
            return [(publication, data) for publication, data in document]
    if package is not None:
        ids = [p.publication_id for p in publications.publications(store, package)]
    else:
        ids = [publication_id] if publication_id is not None else []
    found = []
    for publication in ids:
        records = store.read_stream(publication_stream(publication))
        published = next((r for r in records if r.type == EventType.PUBLICATION_PUBLISHED), None)
        if published is not None:
            found.append((publication, dict(published.data)))
    return found
