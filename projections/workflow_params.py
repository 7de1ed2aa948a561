"""A Workflow's declared parameters as its package's head publication records them:
what a start form offers (plan v2; `domain.params` binds what a start gives)."""

from __future__ import annotations

from domain.errors import InvalidInput, NotFound
from domain.event_types import EventType
from domain.params import ParamDefinition
from domain.revision import revision_from_json
from domain.streams import publication_stream
from eventstore.api import EventStore
from projections import publications


def declared_params(store: EventStore, package: str, workflow: str) -> tuple[ParamDefinition, ...]:
    """The parameters `workflow` of the head of `package` (an installation or package
    name, as `start` resolves it) declares, by name. NotFound for an unknown package
    or Workflow; InvalidInput when the name matches several installations."""
    heads = publications.heads_named(store, package)
    if not heads:
        raise NotFound(f"no published package or installation {package!r}; publish it first")
    if len(heads) > 1:
        names = ", ".join(f"{head.project}/{head.installation}" for head in heads)
        raise InvalidInput(
            "package", "ambiguous", f"{package!r} names several installations ({names})"
        )
    publication_id = heads[0].publication_id
    records = store.read_stream(publication_stream(publication_id))
    published = next((r for r in records if r.type == EventType.PUBLICATION_PUBLISHED), None)
    if published is None:
        raise NotFound(f"publication {publication_id!r} has no published revision")
    revision = revision_from_json(published.data["revision"])
    definition = revision.workflows.get(workflow)
    if definition is None:
        known = ", ".join(sorted(revision.workflows)) or "none"
        raise NotFound(f"package {package!r} has no Workflow {workflow!r} (it has: {known})")
    return tuple(definition.params)
