"""Fixtures of the dashboard's tests: a runtime on each store, the app over it with a
pinned clock, and a client that speaks to it as a loopback browser would."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

import qlflow
from qlflow.ui import create_app
from tests.ui.support import T0

LOOPBACK = "http://127.0.0.1"


class Clock:
    """The app's clock: tests move it by hand."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def rt(store_url: str) -> Iterator[qlflow.Runtime]:
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 + 60_000)


@pytest.fixture
def client(rt: qlflow.Runtime, clock: Clock) -> Iterator[TestClient]:
    app = create_app(rt, token=None, allow_remote=False, clock=clock)
    with TestClient(app, base_url=LOOPBACK, follow_redirects=False) as test_client:
        yield test_client


def csrf_of(html: str) -> str:
    """The CSRF token in a page's first form."""
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "the page has no form with a CSRF token"
    return match.group(1)
