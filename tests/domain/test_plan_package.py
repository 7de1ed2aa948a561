"""The package model a plan is built from: Tasks, Workflows, revisions, publications."""

from __future__ import annotations

import dataclasses
import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import PlanError
from domain.fields import ID_PATTERN
from domain.graph import find_cycle
from domain.publication import (
    PublicationRef,
    publication_for,
    publication_from_json,
    publication_to_json,
)
from domain.revision import (
    materialize_revision,
    package_lock_digest,
    revision_from_json,
    revision_to_json,
)
from domain.tasks import TaskDefinition, define_task, task_source_digest
from domain.workflows import WorkflowDefinition, WorkflowStepDefinition, workflow_semantic_digest
from tests.domain.test_plan import task, workflow
from tests.hypothesis_budget import examples

DIAMOND = {"fetch": [], "left": ["fetch"], "right": ["fetch"], "archive": ["left", "right"]}
HEX_A, HEX_B = "a" * 64, "b" * 64


def rule_of(call, *args, **kwargs) -> str:
    with pytest.raises(PlanError) as caught:
        call(*args, **kwargs)
    return caught.value.rule


def revision(generation: int = 1, installation: str = "inst-1", **overrides):
    tasks = overrides.pop("tasks", [task(key) for key in DIAMOND])
    workflows = overrides.pop("workflows", [workflow(DIAMOND, timeout_ms=60_000)])
    return materialize_revision("proj-1", "backup", installation, generation, tasks, workflows)


# --- Task source digests --------------------------------------------------------------


def test_source_digest_covers_definition_and_file_contents():
    base = define_task(
        "fetch", ["python3", "fetch.py"], files=["fetch.py"], file_digests={"fetch.py": HEX_A}
    )
    other_content = define_task(
        "fetch", ["python3", "fetch.py"], files=["fetch.py"], file_digests={"fetch.py": HEX_B}
    )
    other_command = define_task(
        "fetch", ["python3", "-u", "fetch.py"], files=["fetch.py"], file_digests={"fetch.py": HEX_A}
    )
    other_env = define_task(
        "fetch",
        ["python3", "fetch.py"],
        files=["fetch.py"],
        file_digests={"fetch.py": HEX_A},
        env={"MODE": "x"},
    )
    digests = {t.source_digest for t in (base, other_content, other_command, other_env)}
    assert len(digests) == 4


def test_source_digest_ignores_task_id_enabled_flag_env_order_and_digest_spelling():
    one = define_task(
        "a", ["run"], env={"X": "1", "Y": "2"}, files=["f"], file_digests={"f": HEX_A}
    )
    two = define_task(
        "b",
        ["run"],
        env={"Y": "2", "X": "1"},
        files=["f"],
        file_digests={"f": "sha256:" + HEX_A},
        enabled=False,
    )
    assert one.source_digest == two.source_digest


def test_file_digests_must_cover_exactly_the_named_files():
    definition = {"command": ["run"], "files": ["a.py", "b.py"]}
    assert rule_of(task_source_digest, definition, {"a.py": HEX_A}) == "task_files"
    extra = {"a.py": HEX_A, "b.py": HEX_A, "c.py": HEX_A}
    assert rule_of(task_source_digest, definition, extra) == "task_files"
    assert task_source_digest(definition, {"a.py": HEX_A, "b.py": HEX_B}).startswith("sha256:")


@pytest.mark.parametrize("digest", ["A" * 64, "a" * 63, "md5:abc", 12])
def test_malformed_file_digest_is_refused(digest):
    assert rule_of(task_source_digest, {}, {"f": digest}) in {"file_digest", "type"}


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../up", "a/../b", "a//b", "./a", "a\\b"])
def test_file_paths_must_stay_inside_the_package(path):
    assert rule_of(define_task, "t", ["run"], files=[path], file_digests={path: HEX_A}) == (
        "task_files"
    )


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"command": []}, "task_command"),
        ({"command": [""]}, "task_command"),
        ({"command": ["a\x00b"]}, "task_command"),
        ({"command": "python3 x.py"}, "type"),
        ({"command": ["run", 3]}, "type"),
        ({"command": ["run", 3.0]}, "float"),
        ({"env": {"A=B": "x"}}, "task_env"),
        ({"env": {"": "x"}}, "task_env"),
        ({"env": {"A": 1}}, "type"),
        ({"enabled": 1}, "type"),
        ({"task_id": "bad id"}, "task_id"),
        ({"task_id": "a@b"}, "task_id"),
        ({"source_digest": "abc"}, "source_digest"),
        ({"files": ["x", "x"]}, "task_files"),
    ],
)
def test_malformed_task_definition_is_refused(kwargs, rule):
    fields = {"task_id": "t", "command": ["run"], "source_digest": "sha256:" + HEX_A}
    assert rule_of(TaskDefinition, **{**fields, **kwargs}) == rule


def test_task_normalizes_env_and_files_and_is_hashable():
    one = TaskDefinition(
        "t", ["run"], "sha256:" + HEX_A, env={"B": "2", "A": "1"}, files=["z", "a"]
    )
    two = TaskDefinition(
        "t", ("run",), "sha256:" + HEX_A, env=[("A", "1"), ("B", "2")], files=("a", "z")
    )
    assert one == two and hash(one) == hash(two)
    assert one.env == (("A", "1"), ("B", "2")) and one.files == ("a", "z")
    assert dict(one.environment) == {"A": "1", "B": "2"}


# --- Workflows ------------------------------------------------------------------------


def test_semantic_digest_ignores_step_order_and_enabled_flag():
    tasks = {t.task_id: t for t in (task(k) for k in DIAMOND)}
    one = workflow(DIAMOND)
    two = WorkflowDefinition("nightly", tuple(reversed(one.steps)), enabled=False)
    assert workflow_semantic_digest(one, tasks) == workflow_semantic_digest(two, tasks)


def test_semantic_digest_covers_shape_timeout_and_used_task_sources_only():
    tasks = {t.task_id: t for t in (task(k) for k in [*DIAMOND, "unused"])}
    base = workflow_semantic_digest(workflow(DIAMOND), tasks)
    assert workflow_semantic_digest(workflow(DIAMOND, timeout_ms=5), tasks) != base
    assert workflow_semantic_digest(workflow(DIAMOND, key="weekly"), tasks) != base
    rewired = dict(DIAMOND, archive=["left"])
    assert workflow_semantic_digest(workflow(rewired), tasks) != base
    changed = dict(tasks, left=task("left", command=["other"]))
    assert workflow_semantic_digest(workflow(DIAMOND), changed) != base
    unused_changed = dict(tasks, unused=task("unused", command=["other"]))
    assert workflow_semantic_digest(workflow(DIAMOND), unused_changed) == base


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"key": "no spaces"}, "workflow_key"),
        ({"timeout_ms": 0}, "timeout_ms"),
        ({"timeout_ms": True}, "type"),
        ({"timeout_ms": 2.5}, "float"),
        ({"enabled": "yes"}, "type"),
        ({"steps": ["fetch"]}, "type"),
    ],
)
def test_malformed_workflow_is_refused(kwargs, rule):
    fields = {"key": "nightly", "steps": (WorkflowStepDefinition("a", "a"),)}
    assert rule_of(WorkflowDefinition, **{**fields, **kwargs}) == rule


def test_malformed_step_is_refused():
    assert rule_of(WorkflowStepDefinition, "a#b", "t") == "step_key"
    assert rule_of(WorkflowStepDefinition, "a", "t", ("ok", "not ok")) == "step_key"
    assert rule_of(WorkflowStepDefinition, "a", "t", "b") == "type"


@settings(max_examples=examples(100), deadline=None)
@given(edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=16))
def test_find_cycle_reports_a_real_cycle_exactly_when_there_is_one(edges):
    graph: dict[str, list[str]] = {f"n{i}": [] for i in range(8)}
    for source, target in edges:
        graph[f"n{source}"].append(f"n{target}")
    cycle = find_cycle(graph)
    if cycle is None:
        # Acyclic: repeatedly removing Steps whose needs are all removed empties the graph.
        remaining = dict(graph)
        while remaining:
            free = [k for k, needs in remaining.items() if not set(needs) & remaining.keys()]
            assert free
            for key in free:
                del remaining[key]
    else:
        assert cycle[0] == cycle[-1] and len(cycle) >= 2
        for source, target in itertools.pairwise(cycle):
            assert target in graph[source]


# --- revisions ------------------------------------------------------------------------


def test_materialized_revision_is_deterministic():
    assert revision() == revision()
    assert revision().revision_digest == revision().revision_digest


def test_revision_identity_changes_with_generation_and_installation_but_not_the_lock():
    base = revision()
    for other in (revision(generation=2), revision(installation="inst-2")):
        assert other.revision_digest != base.revision_digest
        assert other.revision_id != base.revision_id
        assert other.lock_digest == base.lock_digest


def test_lock_digest_changes_with_any_content_change():
    base = revision()
    tasks = [task(key) for key in DIAMOND if key != "left"] + [task("left", enabled=False)]
    assert revision(tasks=tasks).lock_digest != base.lock_digest
    slower = [workflow(DIAMOND, timeout_ms=120_000)]
    assert revision(workflows=slower).lock_digest != base.lock_digest
    assert package_lock_digest(base.tasks, base.workflows) == base.lock_digest


def test_revision_id_is_a_short_id_named_by_the_digest():
    base = revision()
    assert ID_PATTERN.fullmatch(base.revision_id)
    assert base.revision_id == "rev:" + base.revision_digest.removeprefix("sha256:")[:32]


def test_materialize_refuses_structurally_broken_workflows():
    tasks = [task(key) for key in DIAMOND]
    cyclic = workflow(dict(DIAMOND, fetch=["archive"]))
    assert rule_of(revision, tasks=tasks, workflows=[cyclic]) == "cycle"
    missing = workflow(dict(DIAMOND, extra=["fetch"]))
    assert rule_of(revision, tasks=tasks, workflows=[missing]) == "unknown_task"
    assert rule_of(revision, tasks=[*tasks, task("fetch")]) == "duplicate_task"
    twice = [workflow(DIAMOND), workflow(DIAMOND)]
    assert rule_of(revision, workflows=twice) == "duplicate_workflow"


def test_materialize_accepts_disabled_tasks_and_workflows():
    tasks = [task(key, enabled=key != "left") for key in DIAMOND]
    built = revision(tasks=tasks, workflows=[workflow(DIAMOND, enabled=False)])
    assert not built.tasks["left"].enabled and not built.workflows["nightly"].enabled


def test_revision_mappings_are_read_only_and_sorted():
    built = revision()
    assert list(built.tasks) == sorted(DIAMOND)
    with pytest.raises(TypeError):
        built.tasks["evil"] = task("evil")  # type: ignore[index]
    assert rule_of(built.task, "ghost") == "unknown_task"
    assert rule_of(built.workflow, "ghost") == "unknown_workflow"


def test_revision_json_round_trip_is_exact():
    built = revision(
        tasks=[
            *[task(k) for k in DIAMOND],
            define_task("env", ["sh"], env={"A": "é\n"}, enabled=False),
        ]
    )
    document = revision_to_json(built)
    assert revision_from_json(document) == built
    assert revision_from_json(orjson.dumps(document)) == built
    assert revision_from_json(orjson.dumps(document).decode()) == built
    assert revision_to_json(revision_from_json(orjson.loads(orjson.dumps(document)))) == document


def tampered_revision(change) -> str:
    document = orjson.loads(orjson.dumps(revision_to_json(revision())))
    change(document)
    return rule_of(revision_from_json, document)


def test_revision_json_is_strict():
    assert tampered_revision(lambda d: d.update(extra=1)) == "unknown_field"
    assert tampered_revision(lambda d: d.pop("lock_digest")) == "missing_field"
    assert tampered_revision(lambda d: d["tasks"]["left"].update(retry=3)) == "unknown_field"
    assert (
        tampered_revision(lambda d: d["workflows"]["nightly"]["steps"][0].update(condition="x"))
        == "unknown_field"
    )
    assert tampered_revision(lambda d: d.update(generation=1.0)) == "float"
    assert tampered_revision(lambda d: d.update(schema="other")) == "schema"
    assert tampered_revision(lambda d: d.update(revision_digest="sha256:" + HEX_A)) == (
        "revision_digest"
    )
    assert tampered_revision(lambda d: d.update(revision_id="rev:x")) == "revision_id"
    # Content changed but digests kept: the recomputed lock digest differs first.
    assert tampered_revision(lambda d: d["tasks"]["left"].update(command=["rm"])) == "lock_digest"
    assert rule_of(revision_from_json, b"{not json") == "json"
    assert rule_of(revision_from_json, [1]) == "type"


def test_revision_json_in_non_canonical_order_is_refused():
    two_files = define_task("two", ["sh"], files=["a", "b"], file_digests={"a": HEX_A, "b": HEX_B})
    document = orjson.loads(
        orjson.dumps(revision_to_json(revision(tasks=[two_files], workflows=[])))
    )
    assert revision_from_json(document).tasks["two"].files == ("a", "b")
    document["tasks"]["two"]["files"] = ["b", "a"]
    assert rule_of(revision_from_json, document) == "revision"


# --- publications ---------------------------------------------------------------------


def test_publication_names_the_revision_and_every_workflow_digest():
    built = revision()
    publication = publication_for(built, "acme")
    assert (publication.project, publication.package, publication.installation) == (
        built.project,
        built.package,
        built.installation,
    )
    assert (publication.lock_digest, publication.generation) == (built.lock_digest, 1)
    assert (publication.revision_id, publication.revision_digest) == (
        built.revision_id,
        built.revision_digest,
    )
    expected = workflow_semantic_digest(built.workflows["nightly"], built.tasks)
    assert dict(publication.workflow_digests) == {"nightly": expected}


def test_publication_id_is_deterministic_stream_safe_and_generation_bound():
    one = publication_for(revision(), "acme")
    assert one == publication_for(revision(), "acme")
    assert len(one.publication_id) <= 36 and ID_PATTERN.fullmatch(one.publication_id)
    assert publication_for(revision(generation=2), "acme").publication_id != one.publication_id
    other_publisher = publication_for(revision(), "other")
    assert other_publisher.publication_digest != one.publication_digest


def test_publication_json_round_trip_and_strictness():
    publication = publication_for(revision(), "acme")
    document = orjson.loads(orjson.dumps(publication_to_json(publication)))
    assert publication_from_json(document) == publication
    assert publication_from_json(orjson.dumps(document)) == publication
    assert rule_of(publication_from_json, {**document, "publisher": "mallory"}) == (
        "publication_digest"
    )
    assert rule_of(publication_from_json, {**document, "generation": 2}) == "publication_id"
    assert rule_of(publication_from_json, {**document, "extra": 1}) == "unknown_field"
    assert rule_of(publication_from_json, {**document, "generation": True}) == "type"


def test_publication_fields_are_checked():
    publication = publication_for(revision(), "acme")
    assert rule_of(dataclasses.replace, publication, publisher="p" * 37) == "publisher"
    assert rule_of(dataclasses.replace, publication, workflow_digests={"w": "x"}) == (
        "workflow_digest"
    )
    assert isinstance(hash(publication), int)
    assert isinstance(publication, PublicationRef)
