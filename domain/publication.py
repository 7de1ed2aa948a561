"""A publication: one publisher makes one materialized revision startable.

It names the revision by id and digest and carries the semantic digest of every
Workflow, which an execution plan must match. Its id derives from the package,
the generation and the revision digest; its digest from every other field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from domain.canonical import DIGEST_PREFIX, PLACEHOLDER_DIGEST, domain_digest
from domain.errors import PlanError
from domain.fields import (
    IDENTIFIER_PATTERN,
    check_digest,
    check_fields,
    check_id,
    check_mapping,
    check_name,
    check_positive_int,
    check_same,
    check_text,
    load_json,
)
from domain.ids import PUBLICATION_ID
from domain.revision import MaterializedRevision
from domain.workflows import workflow_semantic_digest

PUBLICATION_SCHEMA = "qlflow/publication@v1"
PUBLICATION_ID_DOMAIN = "qlflow/publication-id@v1"


@dataclass(frozen=True, slots=True)
class PublicationRef:
    """A publication of one revision by one publisher. `workflow_digests` maps each
    Workflow key to its semantic digest (read-only, sorted by key)."""

    publication_id: str
    publication_digest: str
    publisher: str
    project: str
    package: str
    installation: str
    lock_digest: str
    generation: int
    revision_id: str
    revision_digest: str
    workflow_digests: Mapping[str, str]

    def __post_init__(self) -> None:
        check_id(self.publication_id, "publication_id", "publication_id")
        check_digest(self.publication_digest, "publication_digest", "publication_digest")
        check_id(self.publisher, "publisher", "publisher")
        check_text(self.project, IDENTIFIER_PATTERN, "project", "project")
        check_name(self.package, "package", "package")
        check_text(self.installation, IDENTIFIER_PATTERN, "installation", "installation")
        check_digest(self.lock_digest, "lock_digest", "lock_digest")
        check_positive_int(self.generation, "generation", "generation")
        check_id(self.revision_id, "revision_id", "revision_id")
        check_digest(self.revision_digest, "revision_digest", "revision_digest")
        digests = check_mapping(self.workflow_digests, "workflow_digests")
        for key, digest in digests.items():
            check_name(key, "workflow_key", "workflow_digests key")
            check_digest(digest, "workflow_digest", f"workflow_digests[{key!r}]")
        frozen = MappingProxyType(dict(sorted(digests.items())))
        object.__setattr__(self, "workflow_digests", frozen)

    def __hash__(self) -> int:
        return hash((self.publication_id, self.publication_digest))


def publication_id_for(package: str, generation: int, digest: str) -> str:
    """The publication id of `package` at `generation` with revision digest `digest`:
    "pub:" and 32 hex digits (36 characters, fit for stream ids)."""
    derived = domain_digest(PUBLICATION_ID_DOMAIN, [package, generation, digest])
    return PUBLICATION_ID + derived[len(DIGEST_PREFIX) : len(DIGEST_PREFIX) + 32]


def publication_digest(publication: PublicationRef) -> str:
    """Recompute the digest of `publication` from its other fields."""
    document = publication_to_json(publication)
    del document["publication_digest"]
    return domain_digest(PUBLICATION_SCHEMA, document)


def check_publication(publication: PublicationRef) -> None:
    """Refuse a publication whose id ("publication_id") or digest
    ("publication_digest") does not match its fields."""
    expected_id = publication_id_for(
        publication.package, publication.generation, publication.revision_digest
    )
    check_same(publication.publication_id, expected_id, "publication_id", "publication")
    check_same(
        publication.publication_digest,
        publication_digest(publication),
        "publication_digest",
        "publication",
    )


def publication_for(revision: MaterializedRevision, publisher: str) -> PublicationRef:
    """The publication of `revision` by `publisher`, with every Workflow's semantic digest."""
    draft = PublicationRef(
        publication_id=publication_id_for(
            revision.package, revision.generation, revision.revision_digest
        ),
        publication_digest=PLACEHOLDER_DIGEST,
        publisher=publisher,
        project=revision.project,
        package=revision.package,
        installation=revision.installation,
        lock_digest=revision.lock_digest,
        generation=revision.generation,
        revision_id=revision.revision_id,
        revision_digest=revision.revision_digest,
        workflow_digests={
            key: workflow_semantic_digest(workflow, revision.tasks)
            for key, workflow in revision.workflows.items()
        },
    )
    return dataclasses.replace(draft, publication_digest=publication_digest(draft))


_PUBLICATION_FIELDS = (
    "schema", "publication_id", "publication_digest", "publisher", "project", "package",
    "installation", "lock_digest", "generation", "revision_id", "revision_digest",
    "workflow_digests",
)  # fmt: skip


def publication_to_json(publication: PublicationRef) -> dict[str, Any]:
    """The publication as a JSON-able dict; `publication_from_json` rebuilds it."""
    return {
        "schema": PUBLICATION_SCHEMA,
        "publication_id": publication.publication_id,
        "publication_digest": publication.publication_digest,
        "publisher": publication.publisher,
        "project": publication.project,
        "package": publication.package,
        "installation": publication.installation,
        "lock_digest": publication.lock_digest,
        "generation": publication.generation,
        "revision_id": publication.revision_id,
        "revision_digest": publication.revision_digest,
        "workflow_digests": dict(publication.workflow_digests),
    }


def publication_from_json(value: object) -> PublicationRef:
    """Strictly rebuild a publication (dict, JSON text or bytes), refusing unknown or
    missing fields, wrong types and an id or digest that does not match."""
    document = check_mapping(load_json(value), "publication")
    check_fields(document, _PUBLICATION_FIELDS, "publication")
    if document["schema"] != PUBLICATION_SCHEMA:
        raise PlanError("schema", f"publication schema must be {PUBLICATION_SCHEMA!r}")
    publication = PublicationRef(**{k: v for k, v in document.items() if k != "schema"})
    check_publication(publication)
    return publication
