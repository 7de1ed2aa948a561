"""The least-privilege deployment holds against every role (issue 16's findings as
regression tests): events are written only through `qlflow_append`, the database
enforces the start guard, every lock wait is bounded, and the runtime role runs
the whole product."""

from __future__ import annotations

import dataclasses
import shutil
import time
import types
from pathlib import Path

import orjson
import psycopg
import pytest
from psycopg import errors as pg_errors

import qlflow
from actors import admission
from actors.loading import attempt_lock
from domain.errors import LockTimeout, StoreUnavailable
from domain.revision import _content_document, revision_from_json
from domain.start_guard import start_refusal
from domain.values import ACTIVE, QUARANTINED, REVOKED, WITHDRAWN
from eventstore import open_store
from tests.cli.helpers import EXAMPLES, Spawned, qlflow_json, wait_for
from tests.cli.helpers import qlflow as run_cli
from tests.cycle.helpers import DIAMOND, T0, drive, manifest
from tests.lock_holder import hold_locks

pytestmark = pytest.mark.pg

APPEND = (
    "SELECT positions, refused, moved FROM qlflow_append(%s::text[], %s::bigint[], "
    "%s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[])"
)


def sql_as(url: str, statement: str, params=None):
    with psycopg.connect(url) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def append_as(url: str, stream: str, types_: list[str], data: str = "{}", expected: int = 0):
    """Call qlflow_append as the role of `url`: one stream, one event per type."""
    count = len(types_)
    return sql_as(
        url,
        APPEND,
        (
            [stream],
            [expected],
            [expected + count],
            [f"forged-{stream}-{n}" for n in range(count)],
            [stream] * count,
            list(range(expected + 1, expected + count + 1)),
            types_,
            [data] * count,
            ['{"at_ms": 1}'] * count,
        ),
    )


def denied(url: str, statement: str, params=None) -> str:
    with pytest.raises(pg_errors.InsufficientPrivilege) as caught:
        sql_as(url, statement, params)
    return str(caught.value)


@pytest.fixture
def published_run(rt):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k1", now_ms=T0).run_id
    drive(rt, T0)
    return run_id


def event_count(roles) -> int:
    return sql_as(roles.owner, "SELECT count(*) FROM events")[0][0]


# --- 1. the runtime role runs a whole deployment -----------------------------------------


def test_publish_as_publisher_then_start_and_serve_as_runtime_succeeds(roles, tmp_path: Path):
    shutil.copytree(EXAMPLES / "nightly", tmp_path / "nightly")
    published = qlflow_json("publish", "nightly", db=roles.publisher, cwd=tmp_path)
    started = qlflow_json("start", "backup", "nightly", db=roles.runtime, cwd=tmp_path)
    serve = Spawned(
        "serve",
        "--package-dir",
        "nightly",
        "--interval-ms",
        "100",
        db=roles.runtime,
        cwd=tmp_path,
        name="serve",
    )
    try:

        def finished():
            runs = qlflow_json("runs", db=roles.runtime, cwd=tmp_path)
            done = [run for run in runs if run["run_id"] == started["run_id"]]
            return done[0] if done and done[0]["status"] != "running" else None

        run = wait_for(finished, timeout=60, what="the Run to end")
    finally:
        serve.process.terminate()
        serve.wait()
    assert run["status"] == "succeeded", serve.stderr
    assert run["publication_id"] == published["publication_id"]
    assert "error" not in serve.stderr
    # the logs are the runtime's to read, verify the owner's
    logs = run_cli("logs", started["run_id"], "fetch", db=roles.runtime, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    verified = run_cli("verify", db=roles.owner, cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_worker_runs_a_task_as_runtime(roles, tmp_path: Path):
    shutil.copytree(EXAMPLES / "nightly", tmp_path / "nightly")
    qlflow_json("publish", "nightly", db=roles.publisher, cwd=tmp_path)
    qlflow_json("start", "backup", "nightly", db=roles.runtime, cwd=tmp_path)
    assert run_cli("cycle", db=roles.runtime, cwd=tmp_path).returncode == 0
    worker = run_cli("worker", "--once", "--package-dir", "nightly", db=roles.runtime, cwd=tmp_path)
    assert worker.returncode == 0, worker.stderr
    with qlflow.open(roles.audit, read_only=True) as audit:
        types_ = [record.type for record in audit.store.read_all()]
    assert "attempt.succeeded" in types_


# --- 2. no role but the owner writes the log's tables ------------------------------------


TAMPERING = [
    "INSERT INTO events (global_position, event_id, stream_id, stream_version, type, data, "
    "metadata) VALUES (1000000000000, 'forged', 'run-x', 1, 'x', '{}', '{}')",
    "INSERT INTO events (global_position, event_id, stream_id, stream_version, type, data, "
    "metadata) VALUES (1000000000000, 'forged', 'publication-x', 1, 'x', '{', '{}')",
    "UPDATE events SET type = 'rewritten'",
    "DELETE FROM events",
    "UPDATE qlflow_position SET last = 1",
    "INSERT INTO streams (stream_id, version) VALUES ('run-x', 1)",
    "UPDATE streams SET version = 1",
    "DELETE FROM streams",
    "INSERT INTO qlflow_append_rights (role, prefixes) VALUES ('x', ARRAY[''])",
    "UPDATE qlflow_append_rights SET prefixes = ARRAY['']",
    "SELECT * FROM qlflow_append_core(true, ARRAY['run-x'], ARRAY[0::bigint], "
    "ARRAY[1::bigint], ARRAY['e'], ARRAY['run-x'], ARRAY[1::bigint], "
    "ARRAY['workflow.admitted'], ARRAY['{}'], ARRAY['{}'])",
]


@pytest.mark.parametrize("kind", ["runtime", "publisher", "audit"])
@pytest.mark.parametrize("statement", TAMPERING)
def test_no_role_but_the_owner_may_write_events_heads_counter_or_rights(
    roles, published_run, kind, statement
):
    before = event_count(roles)

    assert "permission denied" in denied(getattr(roles, kind), statement)
    assert event_count(roles) == before


def test_the_publisher_cannot_stop_the_runtime_writing(rt, roles, published_run):
    with pytest.raises(pg_errors.InsufficientPrivilege):
        sql_as(roles.publisher, "UPDATE qlflow_position SET last = 1")
    # the runtime's appends still go through
    receipt = rt.start("demo", "flow", admission_key="k2", now_ms=T0)
    drive(rt, T0)
    assert rt.get_run(receipt.run_id).status == "succeeded"


# --- 3. the append function's own refusals -------------------------------------------------


@pytest.mark.parametrize("kind", ["runtime", "publisher"])
def test_a_forged_workflow_admitted_is_refused(roles, published_run, kind):
    stream = "run-forged" if kind == "runtime" else "publication-forged"
    with pytest.raises(pg_errors.InsufficientPrivilege) as caught:
        append_as(getattr(roles, kind), stream, ["workflow.admitted"])
    message = str(caught.value)
    if kind == "runtime":
        assert "may not append workflow.admitted" in message
    else:  # a publisher may not append to a run- stream at all, nor admit on its own
        assert "may not append" in message


@pytest.mark.parametrize(
    ("kind", "stream"),
    [
        ("runtime", "publication-forged"),
        ("runtime", "publisher-acme"),
        ("publisher", "run-forged"),
        ("publisher", "lease-forged"),
    ],
)
def test_a_role_appends_only_to_its_own_streams(roles, published_run, kind, stream):
    before = event_count(roles)
    with pytest.raises(pg_errors.InsufficientPrivilege) as caught:
        append_as(getattr(roles, kind), stream, ["x.y"])

    assert f"may not append to stream(s) {stream}" in str(caught.value)
    assert event_count(roles) == before


def test_the_audit_role_cannot_call_the_append_function(roles, published_run):
    with pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied for function"):
        append_as(roles.audit, "run-forged", ["x.y"])


@pytest.mark.parametrize(
    ("data", "expected", "error"),
    [
        ('{"plan": {"ru', 0, pg_errors.InvalidTextRepresentation),
        ("[1, 2]", 0, pg_errors.InvalidParameterValue),
        # expected 5 of a stream that does not exist: a refusal
        ('{"reason": "user", "requested_at_ms": 1}', 5, None),
    ],
)
def test_a_malformed_or_misplaced_batch_writes_nothing(roles, published_run, data, expected, error):
    before = event_count(roles)
    if error is None:
        [(positions, refused, moved)] = append_as(
            roles.runtime, "run-new", ["workflow.cancel_requested"], data, expected
        )
        assert (positions, refused, moved) == (None, "run-new", False)
    else:
        with pytest.raises(error):
            append_as(roles.runtime, "run-new", ["x.y"], data, expected)
    assert event_count(roles) == before


def test_versions_that_do_not_follow_the_expected_one_are_refused(roles, published_run):
    with pytest.raises(pg_errors.InvalidParameterValue, match="must have versions 1 to 1"):
        sql_as(
            roles.runtime,
            APPEND,
            (["run-x"], [0], [1], ["e1"], ["run-x"], [7], ["x.y"], ["{}"], ["{}"]),
        )


# --- 4. the start guard is the database's too ----------------------------------------------


@pytest.mark.parametrize("how", ["quarantine", "revoke"])
def test_a_client_without_its_start_guard_cannot_admit_what_the_guard_refuses(
    rt, roles, published_run, monkeypatch, how
):
    publication = rt.publish(manifest(DIAMOND), now_ms=T0)
    if how == "quarantine":
        rt.quarantine(publication.publication_id, now_ms=T0 + 1)
    else:
        rt.revoke_publisher(publication.publisher, now_ms=T0 + 1)
    monkeypatch.setattr(admission, "check_start", lambda *args, **kwargs: None)
    before = event_count(roles)

    with pytest.raises(qlflow.errors.StartGuardError) as caught:
        rt.start("demo", "flow", admission_key="after", now_ms=T0 + 2)

    assert caught.value.reason == ("quarantined" if how == "quarantine" else "publisher_revoked")
    assert "the database refuses" in str(caught.value)
    assert event_count(roles) == before


def guard_cases(revision):
    """Every combination the guard's rules tell apart."""
    [(workflow_key, workflow)] = revision.workflows.items()
    task_id = workflow.steps[0].task
    workflows = {
        "present": dict(revision.workflows),
        "disabled": {workflow_key: dataclasses.replace(workflow, enabled=False)},
        "absent": {},
    }
    tasks = {
        "enabled": dict(revision.tasks),
        "disabled": {
            **revision.tasks,
            task_id: dataclasses.replace(revision.tasks[task_id], enabled=False),
        },
    }
    for publisher_status in (None, ACTIVE, REVOKED):
        for status in (ACTIVE, QUARANTINED, WITHDRAWN, "archived"):
            for head in (True, False):
                for wf_case, wf in workflows.items():
                    for task_case, task_map in tasks.items():
                        yield (
                            (publisher_status, status, head, wf_case, task_case),
                            publisher_status,
                            status,
                            head,
                            types.SimpleNamespace(workflows=wf, tasks=task_map),
                            workflow_key,
                        )


def test_the_database_guard_agrees_with_the_domain_on_every_case(rt, roles, published_run):
    [(data,)] = sql_as(
        roles.owner,
        "SELECT data FROM events WHERE starts_with(stream_id, 'publication-') "
        "AND type = 'publication.published' LIMIT 1",
    )
    revision = revision_from_json(orjson.loads(data)["revision"])
    publication = rt.publish(manifest(DIAMOND), now_ms=T0)
    compared = 0
    with psycopg.connect(roles.runtime) as conn:
        for case, publisher_status, status, head, variant, key in guard_cases(revision):
            chosen = dataclasses.replace(publication, status=status, head=head)
            domain = start_refusal(chosen, publisher_status, chosen, variant, key)
            document = orjson.dumps(_content_document(variant.tasks, variant.workflows))
            [(database,)] = conn.execute(
                "SELECT qlflow_start_refusal(%s, %s, %s, %s::jsonb, %s)",
                (publisher_status, status, head, document.decode(), key),
            ).fetchall()
            assert database == (domain.reason if domain else None), case
            compared += 1
    assert compared == 3 * 4 * 2 * 3 * 2


# --- 5. every lock wait is bounded -----------------------------------------------------------


def hold_advisory_lock(url: str, name: str) -> psycopg.Connection:
    """A session (say the audit role's) holding the advisory lock qlflow names `name`."""
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(
        "SELECT pg_advisory_lock(hashtextextended(coalesce(current_schema(), '') || '/' || %s, 0))",
        (name,),
    )
    return conn


def test_a_held_publisher_lock_bounds_a_start(roles, published_run):
    holder = hold_locks(roles.publisher, ["qlflow-publisher:acme"])
    try:
        with qlflow.open(roles.runtime, lock_timeout_ms=300) as rt:
            began = time.monotonic()
            with pytest.raises((LockTimeout, StoreUnavailable)) as caught:
                rt.start("demo", "flow", admission_key="blocked", now_ms=T0)
            took = time.monotonic() - began
    finally:
        holder.close()
    assert took < 30, took
    assert len(str(caught.value).splitlines()) == 1


def test_an_audit_held_migration_lock_bounds_an_open(pg_url):
    holder = hold_advisory_lock(pg_url, "qlflow-migrations")
    try:
        began = time.monotonic()
        with pytest.raises(LockTimeout) as caught:
            open_store(pg_url, lock_timeout_ms=300)
        took = time.monotonic() - began
    finally:
        holder.close()
    assert took < 30, took
    assert "qlflow-migrations" in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1
    open_store(pg_url).close()  # and once it is released the open goes through


def test_a_held_lock_on_an_attempt_bounds_the_worker(roles, rt):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    rt.start("demo", "flow", admission_key="k1", now_ms=T0)
    rt.cycle(now_ms=T0)
    [lease] = rt.lease_attempts("w1", limit=1, now_ms=T0)
    with qlflow.open(roles.runtime, lock_timeout_ms=300) as worker:
        holder = hold_locks(roles.runtime, [attempt_lock(lease.attempt_id)])
        try:
            began = time.monotonic()
            with pytest.raises((LockTimeout, StoreUnavailable)) as caught:
                worker.mark_running(lease, now_ms=T0 + 1)
            outcome = str(caught.value)
            took = time.monotonic() - began
        finally:
            holder.close()
    assert took < 30, took
    assert "not granted within 300 ms" in outcome
    assert "\n" not in outcome


def test_a_lock_name_in_one_schema_does_not_block_another(roles, published_run, pg_url):
    # the same lock name held in another schema of the same database
    open_store(pg_url).close()
    holder = hold_locks(pg_url, ["qlflow-publisher:acme"])
    try:
        with qlflow.open(roles.runtime, lock_timeout_ms=300) as rt:
            receipt = rt.start("demo", "flow", admission_key="other-schema", now_ms=T0)
    finally:
        holder.close()
    assert receipt.status == "created"
