"""Least-privilege roles (actors.roles): each role is refused what it must
not do, the event log is append-only for everyone but the owner, and admission
reaches the publication tables only through the SECURITY DEFINER function."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import errors as pg_errors

import qlflow
from actors import publishing
from actors import roles as pg_roles
from domain.errors import InvalidInput, SchemaError
from qlflow.errors import AdmissionCollision, NotFound, StartGuardError
from tests.cycle.helpers import DIAMOND, T0, drive, manifest
from tests.pg.conftest import migrate_as_owner

pytestmark = pytest.mark.pg

DENIED = pg_errors.InsufficientPrivilege
EVENT_ROW = (
    "INSERT INTO events (global_position, event_id, stream_id, stream_version, type, data, "
    "metadata) VALUES (999999, 'forged', %s, 1, 'x', '{}', '{}')"
)


def sql_as(url: str, statement: str, params=None):
    """Run one statement as the role of `url` and return its rows (or rowcount)."""
    with psycopg.connect(url) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def refused(url: str, statement: str, params=None) -> str:
    with pytest.raises(DENIED) as caught:
        sql_as(url, statement, params)
    return str(caught.value)


@pytest.fixture
def published_run(rt):
    """A publication and a Run driven to its end, written by publisher and runtime."""
    rt.publish(manifest(DIAMOND), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k1", now_ms=T0).run_id
    drive(rt, T0)
    return run_id


# --- what each role must not do ----------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM publications",
        "SELECT * FROM publishers",
        "UPDATE publications SET status = 'active'",
        "INSERT INTO publishers (publisher, status) VALUES ('evil', 'active')",
    ],
)
def test_runtime_cannot_touch_provenance_tables(roles, published_run, statement):
    assert "permission denied" in refused(roles.runtime, statement)


def test_runtime_does_not_see_provenance_events_and_cannot_forge_them(roles, published_run):
    count = "SELECT count(*) FROM events WHERE starts_with(stream_id, 'publication-')"
    assert sql_as(roles.runtime, count) == [(0,)]
    assert sql_as(roles.audit, count) == [(1,)]
    for stream in ("publication-forged", "publisher-acme"):
        assert "permission denied for table events" in refused(roles.runtime, EVENT_ROW, (stream,))
    assert "permission denied for table streams" in refused(
        roles.runtime, "INSERT INTO streams (stream_id, version) VALUES ('publisher-x', 1)"
    )


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET type = 'rewritten'",
        "DELETE FROM events",
        "TRUNCATE events",
        "UPDATE events SET data = '{}' WHERE starts_with(stream_id, 'run-')",
    ],
)
def test_runtime_cannot_change_or_delete_events(roles, published_run, statement):
    assert "permission denied" in refused(roles.runtime, statement)


def test_runtime_cannot_create_objects_or_move_provenance_heads(roles, published_run):
    refused(roles.runtime, "CREATE TABLE runtime_scratch (a int)")
    # no role but the owner may move a head: appends go through qlflow_append
    assert "permission denied for table streams" in refused(
        roles.runtime,
        "UPDATE streams SET version = version + 1 WHERE starts_with(stream_id, 'publication-')",
    )


@pytest.mark.parametrize(
    "statement",
    [
        EVENT_ROW.replace("%s", "'run-forged'"),
        "UPDATE qlflow_position SET last = last + 1",
        "UPDATE runs SET status = 'succeeded'",
        "DELETE FROM attempts",
        "INSERT INTO streams (stream_id, version) VALUES ('run-forged', 1)",
    ],
)
def test_audit_cannot_append_or_change_anything(roles, published_run, statement):
    refused(roles.audit, statement)


def test_publisher_cannot_see_or_write_runs(roles, published_run):
    refused(roles.publisher, "SELECT * FROM runs")
    refused(roles.publisher, "SELECT * FROM admission_receipts")
    assert sql_as(
        roles.publisher, "SELECT count(*) FROM events WHERE starts_with(stream_id, 'run-')"
    ) == [(0,)]
    assert "permission denied for table events" in refused(
        roles.publisher, EVENT_ROW, ("run-forged",)
    )
    refused(roles.publisher, "DELETE FROM events")


def test_admission_role_cannot_log_in_and_its_function_is_not_public(
    roles, published_run, pg_server_url
):
    admission_url = pg_roles.role_url(pg_server_url, roles.roles["admission"], roles.schema)
    with pytest.raises(psycopg.OperationalError, match="not permitted to log in"):
        psycopg.connect(admission_url).close()
    for url in (roles.audit, roles.publisher):
        refused(url, "SELECT qlflow_admission_source('demo')")


def test_event_log_is_append_only_even_for_a_superuser(roles, published_run, pg_server_url):
    admin = pg_roles.role_url(pg_server_url, "postgres", roles.schema)
    assert "append-only" in refused(admin, "UPDATE events SET type = 'rewritten'")
    assert "append-only" in refused(
        admin, "DELETE FROM events WHERE starts_with(stream_id, 'run-')"
    )
    assert "append-only" in refused(admin, "TRUNCATE events")
    # the owner alone may repair the log: the trigger lets it through (rolled back here)
    with psycopg.connect(roles.owner) as conn:
        assert conn.execute("UPDATE events SET type = type").rowcount > 0
        conn.rollback()


# --- admission through the SECURITY DEFINER function -----------------------------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda rt, pub: rt.withdraw(pub.publication_id, now_ms=T0 + 1), "withdrawn"),
        (lambda rt, pub: rt.quarantine(pub.publication_id, now_ms=T0 + 1), "quarantined"),
        (lambda rt, pub: rt.revoke_publisher("acme", now_ms=T0 + 1), "publisher_revoked"),
    ],
)
def test_runtime_admission_applies_the_start_guard(rt, change, reason):
    publication = rt.publish(manifest(DIAMOND), now_ms=T0)
    admitted = rt.start("demo", "flow", admission_key="before", now_ms=T0)
    change(rt, publication)
    position = rt.store.head_position()
    with pytest.raises(StartGuardError) as caught:
        rt.start("demo", "flow", admission_key="after", now_ms=T0 + 2)
    assert caught.value.reason == reason
    assert rt.store.head_position() == position, "a refusal writes nothing"
    # an exact replay is no new start: it is answered whatever happened since
    again = rt.start("demo", "flow", admission_key="before", now_ms=T0 + 3)
    assert (again.status, again.receipt_digest) == ("existing", admitted.receipt_digest)


def test_runtime_admission_refuses_a_superseded_publication(rt):
    first = rt.publish(manifest(DIAMOND), now_ms=T0)
    second = rt.publish(manifest([("a", [])]), now_ms=T0 + 1)
    assert second.generation == first.generation + 1
    with pytest.raises(StartGuardError) as caught:
        rt.start(first.publication_id, "flow", admission_key="old", now_ms=T0 + 2)
    assert caught.value.reason == "superseded"
    assert second.publication_id in str(caught.value)
    receipt = rt.start("demo", "flow", admission_key="new", now_ms=T0 + 2)
    assert receipt.publication_id == second.publication_id


def test_runtime_admission_names_unknown_and_ambiguous_packages(rt):
    with pytest.raises(NotFound):
        rt.start("nothing", "flow", now_ms=T0)
    for installation in ("east", "west"):
        with_installation = manifest(DIAMOND)
        with_installation["package"]["installation"] = installation
        rt.publish(with_installation, now_ms=T0)
    with pytest.raises(InvalidInput) as caught:
        rt.start("demo", "flow", now_ms=T0)
    assert caught.value.rule == "ambiguous"
    assert rt.start("east", "flow", admission_key="e", now_ms=T0).installation == "east"


def test_runtime_admission_replays_and_collides_like_the_owner(rt, roles):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    created = rt.start("demo", "flow", admission_key="k", now_ms=T0)
    replayed = rt.start("demo", "flow", admission_key="k", now_ms=T0 + 5)
    assert created.status == "created" and replayed.status == "existing"
    assert replayed.receipt_digest == created.receipt_digest
    with pytest.raises(AdmissionCollision):
        rt.start("demo", "flow", admission_key="k", timeout_ms=1_000, now_ms=T0)
    assert rt.inspect_admission(run_id=created.run_id).receipt_digest == created.receipt_digest
    with qlflow.open(roles.owner) as owner:  # the direct path gives the same receipt
        assert owner.start("demo", "flow", admission_key="k").receipt_digest == (
            created.receipt_digest
        )


def test_admission_waits_for_a_revocation_holding_the_publisher_lock(rt, roles, pg_server_url):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    outcome: dict[str, BaseException] = {}

    def admit() -> None:
        try:
            rt.start("demo", "flow", admission_key="racing", now_ms=T0 + 2)
        except BaseException as error:
            outcome["error"] = error

    with rt.publisher.store.transaction() as tx:
        publishing.revoke_publisher_in_tx(tx, "acme", T0 + 1)
        admission = threading.Thread(target=admit)
        admission.start()
        _wait_for_lock_wait(pg_server_url, roles.roles["runtime"])
        assert admission.is_alive(), "admission must wait for the revocation to end"
    admission.join(timeout=30)
    assert isinstance(outcome.get("error"), StartGuardError)
    assert outcome["error"].reason == "publisher_revoked"


def _wait_for_lock_wait(admin_url: str, role: str) -> None:
    deadline = time.monotonic() + 20
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                """SELECT 1 FROM pg_stat_activity WHERE usename = %s
                   AND wait_event_type = 'Lock'""",
                (role,),
            ).fetchone()
            if waiting:
                return
            time.sleep(0.01)
    raise AssertionError("the runtime's admission never waited on the publisher lock")


# --- setup -------------------------------------------------------------------------


def _privileges(admin_url: str, schema: str) -> list[tuple]:
    with psycopg.connect(admin_url) as conn:
        grants = conn.execute(
            """SELECT grantee, table_name, privilege_type FROM information_schema.role_table_grants
               WHERE table_schema = %s ORDER BY 1, 2, 3""",
            (schema,),
        ).fetchall()
        policies = conn.execute(
            """SELECT tablename, policyname, roles::text, cmd, qual, with_check FROM pg_policies
               WHERE schemaname = %s ORDER BY 1, 2""",
            (schema,),
        ).fetchall()
    return grants + policies


def test_setup_is_idempotent_and_repairs_grants(roles, pg_server_url, published_run):
    prefix = roles.roles["owner"].removesuffix("_owner")
    before = _privileges(pg_server_url, roles.schema)
    sql_as(
        pg_roles.role_url(pg_server_url, "postgres", roles.schema),
        f"GRANT SELECT ON publications TO {roles.roles['runtime']}",
    )
    again = pg_roles.setup_roles(pg_server_url, roles.schema, prefix, migrate=migrate_as_owner)
    assert again == roles
    assert _privileges(pg_server_url, roles.schema) == before
    refused(roles.runtime, "SELECT * FROM publications")


def test_setup_refuses_a_table_without_a_policy(roles, pg_server_url):
    prefix = roles.roles["owner"].removesuffix("_owner")
    sql_as(roles.owner, "CREATE TABLE unplanned (a int)")
    with pytest.raises(SchemaError, match="unplanned"):
        pg_roles.setup_roles(pg_server_url, roles.schema, prefix)


@pytest.mark.parametrize(
    ("schema", "prefix"),
    [("Bad-Schema", "ok"), ("ok", "1bad"), ("ok", "x" * 41), ("ok; drop", "ok")],
)
def test_setup_refuses_bad_names_before_touching_the_server(schema, prefix):
    with pytest.raises(InvalidInput):
        pg_roles.setup_roles("postgresql://nobody@127.0.0.1:1/none", schema, prefix)


def test_setup_needs_a_superuser(roles):
    with pytest.raises(InvalidInput, match="superuser"):
        pg_roles.setup_roles(roles.runtime, "elsewhere", "other")


def test_role_urls_carry_role_password_and_schema():
    url = pg_roles.role_url(
        "postgresql://admin:secret@db.example:5433/app?sslmode=require",
        "q_runtime",
        "tenant_a",
        "p@ss word",
    )
    assert url.startswith("postgresql://q_runtime:p%40ss%20word@db.example:5433/app?")
    assert "sslmode=require" in url and "search_path%3Dtenant_a" in url
    assert "secret" not in url and "admin" not in url


def test_setup_adopts_a_schema_the_admin_migrated_and_keeps_its_runs(pg_url, pg_server_url):
    schema = pg_url.rsplit("%3D", 1)[1]
    with qlflow.open(pg_url) as admin_runtime:  # a deployment that ran as a superuser
        admin_runtime.publish(manifest(DIAMOND), now_ms=T0)
        run_id = admin_runtime.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    prefix = f"adopt{schema[-10:]}"
    try:
        urls = pg_roles.setup_roles(pg_server_url, schema, prefix, migrate=migrate_as_owner)
        owners = sql_as(
            pg_roles.role_url(pg_server_url, "postgres", schema),
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = current_schema()",
        )
        assert owners == [(urls.roles["owner"],)]
        refused(urls.runtime, "SELECT * FROM publications")
        with qlflow.open(urls.runtime) as runtime:
            drive(runtime, T0)
            assert runtime.get_run(run_id).status == "succeeded"
    finally:
        pg_roles.drop_roles(pg_server_url, prefix)


def test_setup_sets_passwords_and_puts_them_in_the_urls(roles, pg_server_url):
    prefix = roles.roles["owner"].removesuffix("_owner")
    with pytest.raises(InvalidInput, match="admission"):
        pg_roles.setup_roles(pg_server_url, roles.schema, prefix, passwords={"admission": "x"})
    urls = pg_roles.setup_roles(pg_server_url, roles.schema, prefix, passwords={"runtime": "s3"})
    assert f"{roles.roles['runtime']}:s3@" in urls.runtime
    assert urls.audit == roles.audit
    stored = sql_as(
        pg_server_url,
        "SELECT rolname FROM pg_authid WHERE rolname = ANY(%s) AND rolpassword IS NOT NULL",
        ([roles.roles["runtime"], roles.roles["audit"]],),
    )
    assert stored == [(roles.roles["runtime"],)]


def test_an_admission_source_from_an_older_setup_is_refused_until_set_up_again(
    rt, roles, pg_server_url
):
    """Its lock might not exclude revocation any more: admission fails closed."""
    rt.publish(manifest(DIAMOND), now_ms=T0)
    admin = pg_roles.role_url(pg_server_url, "postgres", roles.schema)
    sql_as(admin, "COMMENT ON FUNCTION qlflow_admission_source(text) IS NULL")
    position = rt.store.head_position()
    with pytest.raises(SchemaError, match="pg-roles"):
        rt.start("demo", "flow", admission_key="k", now_ms=T0)
    assert rt.store.head_position() == position
    prefix = roles.roles["owner"].removesuffix("_owner")
    pg_roles.setup_roles(pg_server_url, roles.schema, prefix)
    assert rt.start("demo", "flow", admission_key="k", now_ms=T0).status == "created"
