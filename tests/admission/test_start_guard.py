"""The start guard (SPEC §4 step 2) and plan binding checks: every refusal has its
own error and reason, and writes nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from actors import admission, publishing
from actors.planned_workflows import PlannedWorkflows
from domain.errors import PlanError, StartGuardError
from domain.ids import PUBLICATION_EVENT, derive_id
from domain.publication import publication_digest, publication_for, publication_to_json
from domain.records import NewEvent, StreamAppend
from domain.revision import revision_to_json
from domain.values import AdmissionReceipt
from projections import registry
from qlflow.packages import load
from tests.admission.support import (
    T0,
    admit,
    census,
    copy_example,
    manifest,
    migrated_store,
    publish,
)


@pytest.fixture
def store(store_url):
    with migrated_store(store_url) as opened:
        yield opened


def _withdrawn(store, tmp_path):
    publication = publish(store, manifest())
    with store.transaction() as tx:
        publishing.withdraw_in_tx(tx, publication.publication_id, T0 + 1)
    return "demo", "flow"


def _quarantined(store, tmp_path):
    publication = publish(store, manifest())
    with store.transaction() as tx:
        publishing.quarantine_in_tx(tx, publication.publication_id, T0 + 1)
    return "demo", "flow"


def _publisher_revoked(store, tmp_path):
    publish(store, manifest())
    with store.transaction() as tx:
        publishing.revoke_publisher_in_tx(tx, "acme", T0 + 1)
    return "demo", "flow"


def _stale_generation(store, tmp_path):
    folder = copy_example(tmp_path)
    old = publish(store, folder)
    (folder / "fetch.py").write_text("print('v2')\n", encoding="utf-8")
    publish(store, folder, T0 + 1)
    return old.publication_id, "nightly"


def _workflow_disabled(store, tmp_path):
    publish(store, manifest(workflow_enabled=False))
    return "demo", "flow"


def _task_disabled(store, tmp_path):
    raw = manifest()
    raw["tasks"]["b"]["enabled"] = False
    publish(store, raw)
    return "demo", "flow"


def _unknown_workflow(store, tmp_path):
    publish(store, manifest())
    return "demo", "flwo"


def _tampered_publication(store, publication, revision) -> None:
    """Record a publication event by hand, as a corrupted or forged log would hold it."""
    event = NewEvent(
        derive_id(PUBLICATION_EVENT, publication.publication_id, "published"),
        "publication.published",
        {
            "publication": publication_to_json(publication),
            "revision": revision,
            "published_at_ms": T0,
        },
        {"at_ms": T0, "causation_id": None, "correlation_id": None, "actor": "user"},
    )
    with store.transaction() as tx:
        registry.commit(
            tx, [StreamAppend(f"publication-{publication.publication_id}", 0, (event,))]
        )


def _revision_drift(store, tmp_path):
    """The publication names one revision; its event carries another (valid) one."""
    named = load(manifest()).revision
    carried = load(manifest(command=("false",))).revision
    _tampered_publication(store, publication_for(named, "acme"), revision_to_json(carried))
    return "demo", "flow"


def _workflow_semantics_drift(store, tmp_path):
    """The publication's digest of the Workflow is not the one the revision gives."""
    revision = load(manifest()).revision
    honest = publication_for(revision, "acme")
    forged = dataclasses.replace(honest, workflow_digests={"flow": "sha256:" + "0" * 64})
    forged = dataclasses.replace(forged, publication_digest=publication_digest(forged))
    _tampered_publication(store, forged, revision_to_json(revision))
    return "demo", "flow"


def _corrupt_revision(store, tmp_path):
    """The recorded revision does not match its own digest."""
    revision = load(manifest()).revision
    document = revision_to_json(revision)
    document["tasks"]["a"]["command"] = ["rm", "-rf", "/"]
    _tampered_publication(store, publication_for(revision, "acme"), document)
    return "demo", "flow"


Setup = Callable[..., tuple[str, str]]
CASES: list[tuple[str, Setup, type[Exception], str, str]] = [
    ("withdrawn", _withdrawn, StartGuardError, "withdrawn", "is withdrawn"),
    ("quarantined", _quarantined, StartGuardError, "quarantined", "is quarantined"),
    (
        "publisher_revoked",
        _publisher_revoked,
        StartGuardError,
        "publisher_revoked",
        "its publisher 'acme' is revoked",
    ),
    (
        "stale_generation",
        _stale_generation,
        StartGuardError,
        "superseded",
        "the current head is generation 2",
    ),
    (
        "workflow_disabled",
        _workflow_disabled,
        StartGuardError,
        "workflow_disabled",
        "Workflow 'flow' is disabled",
    ),
    ("task_disabled", _task_disabled, StartGuardError, "task_disabled", "which is disabled"),
    (
        "unknown_workflow",
        _unknown_workflow,
        StartGuardError,
        "unknown_workflow",
        "has no Workflow 'flwo' (workflows: flow)",
    ),
    ("revision_drift", _revision_drift, PlanError, "lock_digest_drift", "but the revision has"),
    (
        "workflow_semantics_drift",
        _workflow_semantics_drift,
        PlanError,
        "workflow_digest",
        "publication's digest of Workflow 'flow'",
    ),
    ("corrupt_revision", _corrupt_revision, PlanError, "lock_digest", "its content gives"),
]


@pytest.mark.parametrize(
    ("setup", "error", "reason", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_refusal_has_its_own_error_and_writes_nothing(
    store, tmp_path: Path, setup: Setup, error: type[Exception], reason: str, message: str
) -> None:
    package, workflow = setup(store, tmp_path)
    before = census(store), store.head_position()
    with pytest.raises(error) as caught:
        admit(store, package, workflow, "refused")
    found = caught.value.reason if isinstance(caught.value, StartGuardError) else caught.value.rule
    assert found == reason
    assert message in str(caught.value)
    assert (census(store), store.head_position()) == before


def test_withdrawal_after_admission_stops_new_starts_only(store) -> None:
    publication = publish(store, manifest())
    admitted = admit(store, "demo", "flow", "before")
    with store.transaction() as tx:
        publishing.withdraw_in_tx(tx, publication.publication_id, T0 + 1)
    with pytest.raises(StartGuardError, match="is withdrawn"):
        admit(store, "demo", "flow", "after")
    row = store.query("SELECT status, version FROM runs WHERE run_id = ?", (admitted.run_id,))
    assert row == [("running", admitted.final_run_version + 1)]  # its root claimed at start
    assert census(store)["runs"] == 1


def test_a_new_generation_after_withdrawal_starts_again(store) -> None:
    publication = publish(store, manifest())
    with store.transaction() as tx:
        publishing.withdraw_in_tx(tx, publication.publication_id, T0 + 1)
    republished = publish(store, manifest(command=("echo",)), T0 + 2)
    assert republished.generation == 2
    receipt = admit(store, "demo", "flow", "k")
    assert receipt.publication_id == republished.publication_id


def test_a_publisher_known_from_an_earlier_start_is_checked_under_its_lock(store) -> None:
    # a process keeps the publisher each name resolved to and reads the name under
    # that publisher's lock (docs/DESIGN.md "Durable admission"): a name that now
    # resolves to another publisher, or a publisher revoked since, answers as if the
    # process had never started it
    workflows = PlannedWorkflows()

    def start(key: str) -> AdmissionReceipt:
        with store.transaction() as tx:
            return admission.admit_in_tx(
                tx, "demo", "flow", key, None, None, T0 + 9, workflows=workflows
            )

    first = publish(store, manifest())
    assert start("first").publication_id == first.publication_id
    assert workflows.publisher_of("demo") == "acme"
    moved = publish(store, manifest(publisher="globex", command=("echo",)), T0 + 1)
    assert moved.publisher == "globex" and moved.generation == 2
    assert start("moved").publication_id == moved.publication_id
    assert workflows.publisher_of("demo") == "globex"
    with store.transaction() as tx:
        publishing.revoke_publisher_in_tx(tx, "globex", T0 + 2)
    before = census(store), store.head_position()
    with pytest.raises(StartGuardError, match="its publisher 'globex' is revoked"):
        start("revoked")
    assert (census(store), store.head_position()) == before
    replayed = start("moved")  # an exact replay is answered before the guard
    assert (replayed.status, replayed.publication_id) == ("existing", moved.publication_id)
