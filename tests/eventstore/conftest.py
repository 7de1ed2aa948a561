"""An opened store per test, once per dialect."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eventstore import BaseStore, open_store


@pytest.fixture
def store(store_url: str) -> Iterator[BaseStore]:
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()
