"""bench.peers reads the PostgreSQL server's CPU from /proc: the share of a Workflow's
time the client waits for on one connection (the client and the server take turns)."""

from __future__ import annotations

import psycopg
import pytest

from bench.peers import _server_cpu_s, _server_ms_per_workflow


def test_sqlite_has_no_server_cpu():
    assert _server_cpu_s("sqlite:///tmp/q.db") is None
    assert _server_ms_per_workflow("sqlite:///tmp/q.db", None, 10) is None


@pytest.mark.pg
def test_the_server_cpu_grows_with_the_server_work(pg_url):
    before = _server_cpu_s(pg_url)
    if before is None:
        pytest.skip("the PostgreSQL server does not run on this machine: no /proc to read")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)").fetchone()
        # read while the backend lives: /proc forgets an ended process's CPU (and
        # one of another test ending meanwhile takes nothing away)
        spent = _server_ms_per_workflow(pg_url, before, 1)
    assert spent is not None and spent >= 50, spent  # ~0.3 s of work; /proc counts 10 ms ticks
