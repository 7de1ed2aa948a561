"""The start guard (domain.start_guard): one pure rule, raised in one place."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.errors import PlanError, StartGuardError
from domain.plan import build_plan, step_run_ids_for
from domain.publication import publication_for
from domain.start_guard import check_start, start_refusal
from domain.values import ACTIVE, QUARANTINED, REVOKED, WITHDRAWN, Publication
from tests.domain.test_plan import sealed_revision, task, workflow

REVISION = sealed_revision(
    [task("a"), task("b"), task("off", enabled=False)],
    [
        workflow({"a": [], "b": ["a"]}, key="nightly"),
        workflow({"a": []}, key="paused", enabled=False),
        workflow({"a": [], "off": ["a"]}, key="uses_off"),
    ],
)
HEAD = Publication(
    publication_id="pub:2",
    package="backup",
    publisher="acme",
    generation=3,
    revision_digest=REVISION.revision_digest,
    project="proj-1",
    installation="inst-1",
    revision_id=REVISION.revision_id,
    publication_digest="sha256:" + "1" * 64,
    lock_digest=REVISION.lock_digest,
    workflows=("nightly", "paused", "uses_off"),
    status=ACTIVE,
    head=True,
    published_at_ms=1,
)
OLD = dataclasses.replace(HEAD, publication_id="pub:1", generation=2, head=False)


@pytest.mark.parametrize(
    ("publication", "publisher_status", "workflow_key", "reason", "words"),
    [
        (HEAD, REVOKED, "nightly", "publisher_revoked", "its publisher 'acme' is revoked"),
        (dataclasses.replace(HEAD, status=QUARANTINED), None, "nightly", "quarantined", "is q"),
        (dataclasses.replace(HEAD, status=WITHDRAWN), ACTIVE, "nightly", "withdrawn", "publish"),
        (dataclasses.replace(HEAD, status="paused"), None, "nightly", "inactive", "is paused"),
        (OLD, None, "nightly", "superseded", "the current head is generation 3 (pub:2)"),
        (HEAD, None, "nope", "unknown_workflow", "workflows: nightly, paused, uses_off"),
        (HEAD, None, "paused", "workflow_disabled", "Workflow 'paused' is disabled"),
        (HEAD, None, "uses_off", "task_disabled", "uses Task 'off', which is disabled"),
    ],
)
def test_each_rule_refuses_with_its_reason(
    publication, publisher_status, workflow_key, reason, words
):
    refusal = start_refusal(publication, publisher_status, HEAD, REVISION, workflow_key)
    assert refusal is not None and refusal.reason == reason
    assert words in refusal.message and publication.publication_id in refusal.message
    with pytest.raises(StartGuardError) as caught:
        check_start(publication, publisher_status, HEAD, REVISION, workflow_key)
    assert caught.value.reason == reason and str(caught.value) == refusal.message


def test_an_active_head_of_a_trusted_publisher_may_start():
    for status in (None, ACTIVE):
        assert start_refusal(HEAD, status, HEAD, REVISION, "nightly") is None
        check_start(HEAD, status, HEAD, REVISION, "nightly")


def test_a_revoked_publisher_outranks_every_other_refusal():
    worst = dataclasses.replace(OLD, status=QUARANTINED)
    refusal = start_refusal(worst, REVOKED, None, REVISION, "paused")
    assert refusal is not None and refusal.reason == "publisher_revoked"


@given(
    publisher_status=st.sampled_from([None, ACTIVE, REVOKED]),
    status=st.sampled_from([ACTIVE, WITHDRAWN, QUARANTINED]),
    head=st.booleans(),
    workflow_key=st.sampled_from(["nightly", "paused", "uses_off", "nope"]),
)
def test_check_start_raises_exactly_when_the_rule_refuses(
    publisher_status, status, head, workflow_key
):
    publication = dataclasses.replace(HEAD, status=status, head=head)
    refusal = start_refusal(publication, publisher_status, HEAD, REVISION, workflow_key)
    assert refusal == start_refusal(publication, publisher_status, HEAD, REVISION, workflow_key)
    if refusal is None:
        check_start(publication, publisher_status, HEAD, REVISION, workflow_key)
        assert (publisher_status, status, head, workflow_key) in {
            (None, ACTIVE, True, "nightly"),
            (ACTIVE, ACTIVE, True, "nightly"),
        }
    else:
        with pytest.raises(StartGuardError) as caught:
            check_start(publication, publisher_status, HEAD, REVISION, workflow_key)
        assert caught.value.reason == refusal.reason


@pytest.mark.parametrize(
    ("workflow_key", "rule"), [("paused", "workflow_disabled"), ("uses_off", "task_disabled")]
)
def test_the_plan_refuses_disabled_parts_by_the_same_rules(workflow_key, rule):
    publication = publication_for(REVISION, "acme")
    ids = step_run_ids_for("run-1", [s.key for s in REVISION.workflow(workflow_key).steps])
    with pytest.raises(PlanError) as caught:
        build_plan(publication, REVISION, workflow_key, "run-1", ids)
    assert caught.value.rule == rule
    refusal = start_refusal(HEAD, None, HEAD, REVISION, workflow_key)
    assert refusal is not None and refusal.reason == rule
