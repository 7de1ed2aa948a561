"""Publishing, withdrawal, quarantine and publisher trust on both stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors import publishing
from domain.errors import InvalidInput, NotFound
from projections import publications as read_model
from projections import rebuild, verify
from tests.admission.support import (
    T0,
    admit,
    census,
    copy_example,
    manifest,
    migrated_store,
    publish,
    table_rows,
)


@pytest.fixture
def store(store_url):
    with migrated_store(store_url) as opened:
        yield opened


def test_first_publish_is_generation_one_and_head(store, tmp_path: Path) -> None:
    folder = copy_example(tmp_path)
    publication = publish(store, folder)
    assert publication.created
    assert (publication.package, publication.publisher, publication.generation) == (
        "backup",
        "acme",
        1,
    )
    assert publication.head and publication.status == "active"
    assert publication.workflows == ("nightly",)
    records = store.read_stream(f"publication-{publication.publication_id}")
    assert [record.type for record in records] == ["publication.published"]
    data = records[0].data
    assert data["publication"]["publication_id"] == publication.publication_id
    assert data["revision"]["revision_digest"] == publication.revision_digest
    assert data["revision"]["generation"] == 1


def test_publishing_unchanged_content_is_a_no_op(store, tmp_path: Path) -> None:
    folder = copy_example(tmp_path)
    first = publish(store, folder, T0)
    before = store.head_position()
    again = publish(store, folder, T0 + 5)
    assert store.head_position() == before
    assert not again.created
    assert again.publication_id == first.publication_id
    assert again.generation == 1 and again.published_at_ms == T0


def test_a_change_publishes_the_next_generation_as_head(store, tmp_path: Path) -> None:
    folder = copy_example(tmp_path)
    first = publish(store, folder, T0)
    (folder / "fetch.py").write_text("print('v2')\n", encoding="utf-8")
    second = publish(store, folder, T0 + 1)
    assert second.created and second.generation == 2 and second.head
    assert second.publication_id != first.publication_id
    old = read_model.publication(store, first.publication_id)
    assert old is not None and not old.head and old.status == "active"
    head = read_model.installation_head(store, "default", "backup")
    assert head is not None and head.publication_id == second.publication_id
    # going back to the first content is a change too: generation 3
    (folder / "fetch.py").write_bytes(
        (copy_example(tmp_path, "pristine") / "fetch.py").read_bytes()
    )
    third = publish(store, folder, T0 + 2)
    assert third.generation == 3 and third.lock_digest == first.lock_digest
    assert [p.generation for p in read_model.publications(store, "backup") if p.head] == [3]


def test_installations_have_their_own_generations(store) -> None:
    one = publish(store, manifest(name="demo"))
    other = publish(store, manifest(name="demo", extra_package={"installation": "demo-eu"}))
    assert (one.generation, other.generation) == (1, 1)
    assert one.head and other.head
    assert one.publication_id != other.publication_id


def test_withdraw_and_quarantine_are_idempotent_events(store) -> None:
    publication = publish(store, manifest())
    with store.transaction() as tx:
        withdrawn = publishing.withdraw_in_tx(tx, publication.publication_id, T0 + 1, "retired")
    assert withdrawn.status == "withdrawn" and withdrawn.head
    before = store.head_position()
    with store.transaction() as tx:
        publishing.withdraw_in_tx(tx, publication.publication_id, T0 + 2)
    assert store.head_position() == before
    with store.transaction() as tx:
        quarantined = publishing.quarantine_in_tx(tx, publication.publication_id, T0 + 3)
    assert quarantined.status == "quarantined"
    types = [r.type for r in store.read_stream(f"publication-{publication.publication_id}")]
    assert types == ["publication.published", "publication.withdrawn", "publication.quarantined"]
    # unchanged content again: still a no-op returning the (quarantined) head
    again = publish(store, manifest())
    assert not again.created and again.status == "quarantined"


def test_withdrawing_an_unknown_publication_is_not_found(store) -> None:
    with pytest.raises(NotFound, match="no publication 'pub:nope'"), store.transaction() as tx:
        publishing.withdraw_in_tx(tx, "pub:nope", T0)
    assert store.head_position() == 0


def test_publisher_revocation_and_reinstatement(store) -> None:
    publish(store, manifest(publisher="acme"))
    with store.transaction() as tx:
        assert publishing.revoke_publisher_in_tx(tx, "acme", T0 + 1, "key leaked")
    before = census(store)
    with store.transaction() as tx:
        assert not publishing.revoke_publisher_in_tx(tx, "acme", T0 + 2)
    assert census(store) == before
    with pytest.raises(InvalidInput, match="publisher 'acme' is revoked and may not publish"):
        publish(store, manifest(command=("false",)))
    assert census(store) == before
    with store.transaction() as tx:
        assert publishing.reinstate_publisher_in_tx(tx, "acme", T0 + 3)
    assert read_model.publisher_status(store, "acme") == "active"
    assert publish(store, manifest(command=("false",))).generation == 2
    with store.transaction() as tx:
        assert publishing.revoke_publisher_in_tx(tx, "acme", T0 + 4)
    types = [(r.stream_version, r.type) for r in store.read_stream("publisher-acme")]
    assert types == [
        (1, "publisher.revoked"),
        (2, "publisher.reinstated"),
        (3, "publisher.revoked"),
    ]


def test_revoking_an_unknown_publisher_is_not_found(store) -> None:
    publish(store, manifest(publisher="acme"))
    with pytest.raises(NotFound, match="no publisher 'acm'"), store.transaction() as tx:
        publishing.revoke_publisher_in_tx(tx, "acm", T0)


def test_read_models_rebuild_identically_from_the_log(store, tmp_path: Path) -> None:
    folder = copy_example(tmp_path)
    first = publish(store, folder)
    (folder / "fetch.py").write_text("print('v2')\n", encoding="utf-8")
    publish(store, folder, T0 + 1)
    publish(store, manifest())
    admit(store, "backup", "nightly", "k1")
    admit(store, "demo", "flow", "k2")
    with store.transaction() as tx:
        publishing.withdraw_in_tx(tx, first.publication_id, T0 + 2)
        publishing.revoke_publisher_in_tx(tx, "acme", T0 + 3)
        publishing.reinstate_publisher_in_tx(tx, "acme", T0 + 4)
    tables = {"publications": "publication_id", "publishers": "publisher"}
    tables["admission_receipts"] = "receipt_stream"
    live = {table: table_rows(store, table, order) for table, order in tables.items()}
    assert all(live.values())
    rebuild.rebuild(store)
    assert {table: table_rows(store, table, order) for table, order in tables.items()} == live
    assert verify.verify(store).ok
