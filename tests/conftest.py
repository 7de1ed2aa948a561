"""Store fixtures every layer's tests share.

- `sqlite_url`: a SQLite file in the test's tmp_path.
- `pg_url`: a fresh PostgreSQL schema per test (search_path set through the URL),
  dropped afterwards. Needs QLFLOW_TEST_PG_URL; without it the test is skipped, and
  if it is set but the server cannot be reached the test fails (never a silent skip).
- `store_url`: each test runs once per dialect ("sqlite", "postgresql").

Also here, once for the whole suite: the hypothesis profile (tests/hypothesis_budget.py),
the `pg` mark on every test that reaches PostgreSQL through these fixtures, and the
run report CI checks (tests/run_report.py, written when QLFLOW_TEST_REPORT is set).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from eventstore.url import with_search_path
from tests import hypothesis_budget, run_report

PG_ENV = "QLFLOW_TEST_PG_URL"
hypothesis_budget.load_profile()
_report = run_report.RunReport(run_report.TRACKED_MARKS)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a test that asks for the server is a PostgreSQL test, marked or not: CI counts them
    fuzzing = hypothesis_budget.fuzz_examples() is not None
    for item in items:
        if "pg_server_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pg)
        if fuzzing:  # a long hunt is long by design: no per-test timeout
            item.add_marker(pytest.mark.timeout(0), append=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    _report.collected(session.items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _report.record(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get(run_report.REPORT_ENV)
    if path and not hasattr(session.config, "workerinput"):  # xdist: the controller's
        _report.write(path, int(exitstatus))


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """URL of a fresh SQLite database file in tmp_path."""
    return f"sqlite:///{tmp_path / 'qlflow.db'}"


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """QLFLOW_TEST_PG_URL, checked once per session."""
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set: PostgreSQL tests skipped")
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        pytest.fail(f"{PG_ENV} is set but PostgreSQL cannot be reached at {url!r}: {exc}")
    return url


@pytest.fixture
def pg_url(pg_server_url: str) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL schema (dropped after the test)."""
    schema = f"t_{uuid.uuid4().hex}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(pg_server_url, schema)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            # a test that leaked an open transaction must not hang the whole run here
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh store URL, once per dialect."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
