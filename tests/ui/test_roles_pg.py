"""On PostgreSQL's least-privilege roles: the read pages work as the audit role, and
what a role may not do is a 403 page that says why, never a 500."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from starlette.testclient import TestClient

import qlflow
from actors import roles as pg_roles
from qlflow.ui import create_app
from tests.ui.conftest import LOOPBACK, csrf_of
from tests.ui.support import T0, scenario

pytestmark = pytest.mark.pg


@pytest.fixture
def roles(pg_server_url: str) -> Iterator[tuple[pg_roles.RoleUrls, dict]]:
    """A fresh schema with its roles, and the scenario's Runs written as its owner."""
    suffix = uuid.uuid4().hex[:12]
    schema, prefix = f"r_{suffix}", f"q{suffix}"
    try:
        urls = pg_roles.setup_roles(
            pg_server_url, schema, prefix, migrate=lambda url: qlflow.open(url).close()
        )
        with qlflow.open(urls.owner) as owner:
            ids = scenario(owner)
            owner.append_log(ids["lease"].attempt_id, [("stdout", T0 + 2100, b"hello from a\n")])
        yield urls, ids
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        pg_roles.drop_roles(pg_server_url, prefix)


def client_as(url: str) -> tuple[qlflow.Runtime, TestClient]:
    rt = qlflow.open(url)
    app = create_app(rt, token=None, allow_remote=False, clock=lambda: T0 + 60_000)
    return rt, TestClient(app, base_url=LOOPBACK, follow_redirects=False)


def test_the_audit_role_reads_every_page_and_may_not_act(roles):
    urls, ids = roles
    rt, client = client_as(urls.audit)
    try:
        for path in (
            "/runs",
            "/runs?status=failed",
            f"/runs/{ids['failed']}",
            f"/runs/{ids['running']}",
            f"/runs/{ids['running']}/live",
            f"/runs/{ids['failed']}/steps/b",
            "/packages",
            "/schedules",
            "/start?package=demo&workflow=flow",
        ):
            assert client.get(path).status_code == 200, path
        step = client.get(f"/runs/{ids['running']}/steps/a")  # its log, from the store
        assert step.status_code == 200 and "hello from a" in step.text
        attempt_id = ids["lease"].attempt_id
        tail = client.get(f"/runs/{ids['running']}/attempts/{attempt_id}/log?after=0")
        assert tail.status_code == 200 and "hello from a" in tail.text
        token = csrf_of(client.get(f"/runs/{ids['running']}").text)
        refused = client.post(f"/runs/{ids['running']}/cancel", data={"csrf": token})
        assert refused.status_code == 403
        assert "Not allowed for this database role" in refused.text
        assert rt.get_run(ids["running"]).cancel_requested_at_ms is None
    finally:
        client.close()
        rt.close()


def test_the_runtime_role_acts_and_is_told_what_it_may_not_read(roles):
    urls, ids = roles
    rt, client = client_as(urls.runtime)
    try:
        runs = client.get("/runs")  # the filter suggestions come from publications: none
        assert runs.status_code == 200 and 'data-matching="4"' in runs.text
        assert client.get("/packages").status_code == 403
        token = csrf_of(client.get(f"/runs/{ids['running']}").text)
        done = client.post(f"/runs/{ids['running']}/cancel", data={"csrf": token})
        assert done.status_code == 303
        assert rt.get_run(ids["running"]).cancel_reason == "user"
        # a refused binding with no form to show it on (the role may not read the
        # Workflow's declarations) is still the binding's error, nothing started
        before = len(rt.runs())
        bad = client.post(
            "/start", data={"csrf": token, "package": "demo", "workflow": "flow", "param.x": "1"}
        )
        assert bad.status_code == 400 and "unknown parameter" in bad.text
        assert len(rt.runs()) == before
    finally:
        client.close()
        rt.close()
