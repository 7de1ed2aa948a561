"""build_plan: one test per rule of SPEC §3, plus the shape of a good plan.

The helpers at the top are shared with the other test_plan_* modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest

from domain.errors import PlanError
from domain.ids import STEP_RUN_ID, derive_id
from domain.plan import (
    MAX_PLAN_BYTES,
    PLAN_SCHEMA,
    ExecutionPlan,
    build_plan,
    normalize,
    plan_digest,
    plan_to_dict,
    step_run_ids_for,
)
from domain.publication import (
    PublicationRef,
    publication_digest,
    publication_for,
    publication_id_for,
)
from domain.revision import (
    MaterializedRevision,
    materialize_revision,
    package_lock_digest,
    revision_digest,
    revision_id_for,
)
from domain.tasks import TaskDefinition, define_task
from domain.workflows import WorkflowDefinition, WorkflowStepDefinition

RUN_ID = "run-0001"


def task(
    task_id: str, *, enabled: bool = True, command: Sequence[str] | None = None
) -> TaskDefinition:
    return define_task(
        task_id,
        command or ["python3", f"{task_id}.py"],
        files=[f"{task_id}.py"],
        file_digests={f"{task_id}.py": f"{len(task_id):064x}"},
        enabled=enabled,
    )


def workflow(
    steps: Mapping[str, Sequence[str]],
    *,
    key: str = "nightly",
    tasks: Mapping[str, str] | None = None,
    timeout_ms: int | None = None,
    enabled: bool = True,
) -> WorkflowDefinition:
    """A Workflow whose Step k runs Task `tasks[k]` (default: Task k) after `steps[k]`."""
    tasks = tasks or {}
    return WorkflowDefinition(
        key=key,
        steps=tuple(
            WorkflowStepDefinition(step_key, tasks.get(step_key, step_key), tuple(needs))
            for step_key, needs in steps.items()
        ),
        timeout_ms=timeout_ms,
        enabled=enabled,
    )


def sealed_revision(
    tasks: Sequence[TaskDefinition],
    workflows: Sequence[WorkflowDefinition],
    *,
    generation: int = 3,
) -> MaterializedRevision:
    """A revision with correct lock digest, id and digest but *no* structural checks,
    so build_plan itself must refuse a bad Workflow."""
    draft = MaterializedRevision(
        project="proj-1",
        package="backup",
        installation="inst-1",
        lock_digest="sha256:" + "0" * 64,
        generation=generation,
        revision_id="rev:0",
        revision_digest="sha256:" + "0" * 64,
        tasks=tuple(tasks),
        workflows=tuple(workflows),
    )
    draft = dataclasses.replace(
        draft, lock_digest=package_lock_digest(draft.tasks, draft.workflows)
    )
    digest = revision_digest(draft)
    return dataclasses.replace(draft, revision_digest=digest, revision_id=revision_id_for(digest))


def resealed(publication: PublicationRef, **changes: object) -> PublicationRef:
    """`publication` with `changes` and a recomputed (so self-consistent) id and digest."""
    changed = dataclasses.replace(publication, **changes)
    changed = dataclasses.replace(
        changed,
        publication_id=publication_id_for(
            changed.package, changed.generation, changed.revision_digest
        ),
    )
    return dataclasses.replace(changed, publication_digest=publication_digest(changed))


def plan_for(
    steps: Mapping[str, Sequence[str]],
    *,
    run_id: str = RUN_ID,
    timeout_ms: int | None = None,
    workflow_timeout_ms: int | None = None,
) -> ExecutionPlan:
    revision = sealed_revision(
        [task(key) for key in steps], [workflow(steps, timeout_ms=workflow_timeout_ms)]
    )
    publication = publication_for(revision, "acme")
    return build_plan(
        publication, revision, "nightly", run_id, step_run_ids_for(run_id, steps), timeout_ms
    )


def refused(rule: str, steps: Mapping[str, Sequence[str]], **kwargs: object) -> PlanError:
    with pytest.raises(PlanError) as caught:
        plan_for(steps, **kwargs)
    assert caught.value.rule == rule, caught.value
    return caught.value


DIAMOND = {"fetch": [], "left": ["fetch"], "right": ["fetch"], "archive": ["right", "left"]}


@pytest.fixture
def diamond() -> tuple[PublicationRef, MaterializedRevision]:
    revision = materialize_revision(
        "proj-1", "backup", "inst-1", 3, [task(key) for key in DIAMOND], [workflow(DIAMOND)]
    )
    return publication_for(revision, "acme"), revision


def build(
    publication: PublicationRef,
    revision: MaterializedRevision,
    *,
    workflow_key: str = "nightly",
    step_run_ids: object = None,
    run_id: str = RUN_ID,
    timeout_ms: object = None,
) -> ExecutionPlan:
    if step_run_ids is None:
        step_run_ids = step_run_ids_for(run_id, revision.workflow(workflow_key).step_keys)
    return build_plan(publication, revision, workflow_key, run_id, step_run_ids, timeout_ms)


def expect_rule(rule: str, publication, revision, **kwargs) -> PlanError:
    with pytest.raises(PlanError) as caught:
        build(publication, revision, **kwargs)
    assert caught.value.rule == rule, caught.value
    return caught.value


# --- a good plan ----------------------------------------------------------------------


def test_plan_binds_publication_revision_workflow_and_every_step(diamond):
    publication, revision = diamond
    plan = build(publication, revision)

    assert plan.schema == PLAN_SCHEMA
    assert (plan.project, plan.package, plan.installation) == ("proj-1", "backup", "inst-1")
    assert plan.lock_digest == revision.lock_digest
    assert (plan.generation, plan.revision_id, plan.revision_digest) == (
        3,
        revision.revision_id,
        revision.revision_digest,
    )
    assert (plan.publication_id, plan.publication_digest) == (
        publication.publication_id,
        publication.publication_digest,
    )
    assert plan.workflow_digest == publication.workflow_digests["nightly"]
    assert plan.run_id == RUN_ID
    assert plan.step_keys == ("archive", "fetch", "left", "right")
    archive = plan.step("archive")
    assert archive.needs == ("left", "right")
    assert archive.task_ref == "backup@3#archive"
    assert archive.source_digest == revision.tasks["archive"].source_digest
    assert archive.step_run_id == derive_id(STEP_RUN_ID, RUN_ID, "archive")
    statuses = {step.key: step.initial_status for step in plan.steps}
    assert statuses == {
        "archive": "pending",
        "fetch": "ready",
        "left": "pending",
        "right": "pending",
    }


def test_plan_digest_is_the_domain_separated_digest_of_the_plan_without_it(diamond):
    plan = build(*diamond)
    document = plan_to_dict(plan)
    stated = document.pop("plan_digest")
    assert stated == plan.plan_digest == plan_digest(document)
    assert stated.startswith("sha256:") and len(stated) == 71


def test_same_inputs_build_the_same_plan_and_another_run_id_another_digest(diamond):
    assert build(*diamond) == build(*diamond)
    other = build(*diamond, run_id="run-0002")
    assert other.plan_digest != build(*diamond).plan_digest
    assert {s.step_run_id for s in other.steps}.isdisjoint(
        {s.step_run_id for s in build(*diamond).steps}
    )


def test_caller_may_supply_its_own_step_run_ids(diamond):
    ids = {key: f"mine.{key}" for key in DIAMOND}
    plan = build(*diamond, step_run_ids=ids)
    assert {step.key: step.step_run_id for step in plan.steps} == ids


def test_timeout_argument_overrides_workflow_timeout_which_overrides_none():
    assert plan_for({"a": []}).timeout_ms is None
    assert plan_for({"a": []}, workflow_timeout_ms=600_000).timeout_ms == 600_000
    assert plan_for({"a": []}, workflow_timeout_ms=600_000, timeout_ms=5).timeout_ms == 5
    assert plan_for({"a": []}, timeout_ms=7).timeout_ms == 7


def test_largest_allowed_workflow_builds():
    steps = {f"s{i:03d}": [f"s{i - 1:03d}"] if i else [] for i in range(128)}
    plan = plan_for(steps)
    assert len(plan.steps) == 128
    assert [s.initial_status for s in plan.steps].count("ready") == 1


# --- graph rules ----------------------------------------------------------------------


def test_cycle_is_refused_and_the_message_shows_the_cycle_path():
    error = refused("cycle", {"a": ["c"], "b": ["a"], "c": ["b"], "d": []})
    assert "a -> c -> b -> a" in str(error)


def test_self_dependency_is_a_cycle():
    error = refused("cycle", {"a": ["a"]})
    assert "a -> a" in str(error)


def test_need_naming_no_step_is_refused():
    error = refused("unknown_need", {"a": [], "b": ["ghost"]})
    assert "ghost" in str(error)


def test_duplicate_need_is_refused():
    refused("duplicate_need", {"a": [], "b": ["a", "a"]})


def test_duplicate_step_key_is_refused():
    revision = sealed_revision(
        [task("a")],
        [
            WorkflowDefinition(
                "nightly", (WorkflowStepDefinition("a", "a"), WorkflowStepDefinition("a", "a"))
            )
        ],
    )
    publication = publication_for(revision, "acme")
    expect_rule("duplicate_step", publication, revision, step_run_ids={"a": "x1"})


def test_more_than_128_steps_is_refused():
    error = refused("too_many_steps", {f"s{i:03d}": [] for i in range(129)})
    assert "129" in str(error)


def test_workflow_without_steps_is_refused():
    revision = sealed_revision([task("a")], [WorkflowDefinition("nightly", ())])
    expect_rule("empty_workflow", publication_for(revision, "acme"), revision, step_run_ids={})


def test_encoded_plan_over_256_kib_is_refused():
    # 128 Steps with 64-character keys, each needing every earlier Step.
    keys = [f"{i:03d}".ljust(64, "k") for i in range(128)]
    steps = {key: keys[:index] for index, key in enumerate(keys)}
    error = refused("plan_size", steps)
    assert str(MAX_PLAN_BYTES) in str(error)


# --- Task and Workflow rules ----------------------------------------------------------


def test_step_using_a_task_not_in_the_revision_is_refused():
    revision = sealed_revision([task("a")], [workflow({"a": [], "b": ["a"]})])
    error = expect_rule("unknown_task", publication_for(revision, "acme"), revision)
    assert "'b'" in str(error)


def test_disabled_task_is_refused():
    revision = sealed_revision(
        [task("a"), task("b", enabled=False)], [workflow({"a": [], "b": ["a"]})]
    )
    expect_rule("task_disabled", publication_for(revision, "acme"), revision)


def test_disabled_workflow_is_refused():
    revision = sealed_revision([task("a")], [workflow({"a": []}, enabled=False)])
    expect_rule("workflow_disabled", publication_for(revision, "acme"), revision)


def test_unknown_workflow_is_refused(diamond):
    with pytest.raises(PlanError) as caught:
        build_plan(*diamond, "weekly", RUN_ID, {})
    assert caught.value.rule == "unknown_workflow"


def test_publication_semantic_digest_must_match_the_revision(diamond):
    publication, revision = diamond
    other = dict(publication.workflow_digests, nightly="sha256:" + "e" * 64)
    expect_rule("workflow_digest", resealed(publication, workflow_digests=other), revision)


def test_publication_without_a_digest_for_the_workflow_is_refused(diamond):
    publication, revision = diamond
    expect_rule("workflow_digest", resealed(publication, workflow_digests={}), revision)


def test_semantic_digest_tracks_task_sources_of_the_workflow(diamond):
    publication, _revision = diamond
    # Same shape, but Task "left" runs another command: another semantic digest.
    tasks = [task(key) for key in DIAMOND if key != "left"]
    tasks.append(task("left", command=["python3", "other.py"]))
    changed = materialize_revision("proj-1", "backup", "inst-1", 3, tasks, [workflow(DIAMOND)])
    stale = resealed(
        publication,
        lock_digest=changed.lock_digest,
        revision_id=changed.revision_id,
        revision_digest=changed.revision_digest,
    )
    expect_rule("workflow_digest", stale, changed)


# --- publication / revision binding ---------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("project", "proj-2"),
        ("package", "restore"),
        ("installation", "inst-2"),
        ("lock_digest", "sha256:" + "1" * 64),
        ("generation", 4),
        ("revision_id", "rev:ffffffffffffffffffffffffffffffff"),
        ("revision_digest", "sha256:" + "2" * 64),
    ],
)
def test_publication_and_revision_must_agree(diamond, field, value):
    publication, revision = diamond
    error = expect_rule(f"{field}_drift", resealed(publication, **{field: value}), revision)
    assert field in str(error)


def test_publication_digest_must_match_its_fields(diamond):
    publication, revision = diamond
    tampered = dataclasses.replace(publication, publisher="mallory")
    expect_rule("publication_digest", tampered, revision)


def test_publication_id_must_match_its_fields(diamond):
    publication, revision = diamond
    tampered = dataclasses.replace(publication, publication_id="pub:0123")
    expect_rule("publication_id", tampered, revision)


def test_revision_digest_must_match_its_content(diamond):
    publication, revision = diamond
    tasks = dict(revision.tasks, fetch=task("fetch", command=["rm", "-rf", "data"]))
    expect_rule("revision_digest", publication, dataclasses.replace(revision, tasks=tasks))


def test_revision_id_must_match_its_digest(diamond):
    publication, revision = diamond
    tampered = dataclasses.replace(revision, revision_id="rev:other")
    expect_rule("revision_id", publication, tampered)


# --- StepRun ids ----------------------------------------------------------------------


def test_missing_step_run_id_is_refused(diamond):
    ids = step_run_ids_for(RUN_ID, ["fetch", "left", "right"])
    error = expect_rule("step_run_id_missing", *diamond, step_run_ids=ids)
    assert "archive" in str(error)


def test_extra_step_run_id_is_refused(diamond):
    ids = step_run_ids_for(RUN_ID, [*DIAMOND, "extra"])
    error = expect_rule("step_run_id_extra", *diamond, step_run_ids=ids)
    assert "extra" in str(error)


def test_duplicate_step_run_id_is_refused(diamond):
    ids = dict(step_run_ids_for(RUN_ID, DIAMOND), left="srn:same", right="srn:same")
    expect_rule("step_run_id_duplicate", *diamond, step_run_ids=ids)


@pytest.mark.parametrize("bad", ["", "x" * 37, "has space", "a/b", "-leading", "é"])
def test_malformed_step_run_id_is_refused(diamond, bad):
    ids = dict(step_run_ids_for(RUN_ID, DIAMOND), left=bad)
    expect_rule("step_run_id", *diamond, step_run_ids=ids)


def test_step_run_id_of_36_characters_is_accepted(diamond):
    ids = dict(step_run_ids_for(RUN_ID, DIAMOND), left="L" * 36)
    assert build(*diamond, step_run_ids=ids).step("left").step_run_id == "L" * 36


def test_step_run_ids_must_be_a_mapping(diamond):
    expect_rule("type", *diamond, step_run_ids=[("fetch", "a")])


# --- scalar arguments -----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "r" * 37, "run 1", "run/1"])
def test_malformed_run_id_is_refused(diamond, bad):
    expect_rule("run_id", *diamond, run_id=bad, step_run_ids={k: f"id-{k}" for k in DIAMOND})


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (0, "timeout_ms"),
        (-5, "timeout_ms"),
        (2**53, "timeout_ms"),
        (True, "type"),
        ("10", "type"),
        (1.5, "float"),
        (10.0, "float"),
    ],
)
def test_timeout_must_be_a_positive_integer(diamond, value, rule):
    expect_rule(rule, *diamond, timeout_ms=value)


def test_float_step_run_id_is_refused_as_float(diamond):
    ids = dict(step_run_ids_for(RUN_ID, DIAMOND), left=1.0)
    expect_rule("float", *diamond, step_run_ids=ids)


def test_float_in_workflow_definition_is_refused_as_float():
    with pytest.raises(PlanError) as caught:
        workflow({"a": []}, timeout_ms=1.5)
    assert caught.value.rule == "float"


def test_normalize_accepts_the_plan_object_itself(diamond):
    plan = build(*diamond)
    assert normalize(plan) == plan
