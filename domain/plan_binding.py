"""What `build_plan` checks before it binds a Run: the revision is what its digest
says, the publication and revision agree on every bound field, and every Step has
exactly one StepRun id of its own. Each refusal is a PlanError naming the rule."""

from __future__ import annotations

from domain.errors import PlanError
from domain.fields import check_id, check_mapping
from domain.publication import PublicationRef
from domain.revision import MaterializedRevision, revision_digest, revision_id_for


def check_revision_integrity(revision: MaterializedRevision) -> None:
    """The revision's digest and id are the ones its content gives."""
    computed = revision_digest(revision)
    if revision.revision_digest != computed:
        raise PlanError(
            "revision_digest",
            f"revision states digest {revision.revision_digest}, its content gives {computed}",
        )
    if revision.revision_id != revision_id_for(computed):
        raise PlanError(
            "revision_id", f"revision id {revision.revision_id!r} does not match its digest"
        )


_BINDING_FIELDS = (
    "project", "package", "installation", "lock_digest", "generation",
    "revision_id", "revision_digest",
)  # fmt: skip


def check_binding(publication: PublicationRef, revision: MaterializedRevision) -> None:
    """Publication and revision agree on project, package, installation, lock,
    generation, revision id and digest ("<field>_drift")."""
    for field in _BINDING_FIELDS:
        published, materialized = getattr(publication, field), getattr(revision, field)
        if published != materialized:
            raise PlanError(
                f"{field}_drift",
                f"publication has {field} {published!r} but the revision has {materialized!r}",
            )


def check_step_run_ids(step_run_ids: object, step_keys: list[str]) -> dict[str, str]:
    """Exactly one StepRun id per Step key, none shared; the ids by key."""
    ids = check_mapping(step_run_ids, "step_run_ids")
    missing = sorted(set(step_keys) - ids.keys())
    if missing:
        raise PlanError("step_run_id_missing", f"no StepRun id for Step(s) {', '.join(missing)}")
    extra = sorted(ids.keys() - set(step_keys))
    if extra:
        raise PlanError("step_run_id_extra", f"StepRun ids for unknown Step(s) {', '.join(extra)}")
    owners: dict[str, str] = {}
    for key in sorted(ids):
        step_run_id = check_id(ids[key], "step_run_id", f"StepRun id of Step {key!r}")
        if step_run_id in owners:
            raise PlanError(
                "step_run_id_duplicate",
                f"Steps {owners[step_run_id]!r} and {key!r} share StepRun id {step_run_id!r}",
            )
        owners[step_run_id] = key
    return dict(ids)
