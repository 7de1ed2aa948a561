"""Temporary stand-in for the shared fixtures until tests/conftest.py lands."""

from __future__ import annotations

import os
import uuid
from urllib.parse import quote

import psycopg
import pytest


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'qlflow.db'}"


@pytest.fixture
def pg_url():
    base = os.environ.get("QLFLOW_TEST_PG_URL")
    if not base:
        pytest.skip("QLFLOW_TEST_PG_URL is not set")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield f"{base}?options={quote(f'-c search_path={schema}')}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
