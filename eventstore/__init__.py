"""Append-only event store: one contract (`api`), SQLite and PostgreSQL adapters::

store = eventstore.open_store("sqlite:///qlflow.db")
store = eventstore.open_store("postgresql://user@host/db", pool_max_size=20)
"""

from __future__ import annotations

from typing import Any

from domain.errors import InvalidInput
from eventstore.api import EventStore, MigrationStep, StoreUsageError, Transaction
from eventstore.store import BaseStore
from eventstore.url import parse_store_url

__all__ = [
    "BaseStore",
    "EventStore",
    "MigrationStep",
    "StoreUsageError",
    "Transaction",
    "open_store",
]


def open_store(url: str, **options: Any) -> BaseStore:
    """Open (creating and migrating as needed) the event store at `url`.

    SQLite options: `synchronous` ("FULL" default, "NORMAL", "OFF", "EXTRA"),
    `busy_timeout_ms` (5000) — also accepted in the URL query string.
    PostgreSQL options: `pool_max_size` (10), `connect_timeout_s` (10).
    Raises InvalidInput for an unknown scheme or option."""
    parsed = parse_store_url(url)
    if parsed.dialect == "sqlite":
        from eventstore.sqlite_store import SYNCHRONOUS_LEVELS, SqliteStore

        merged = {**parsed.options, **options}
        _reject_unknown(merged, ("synchronous", "busy_timeout_ms"), "sqlite")
        synchronous = str(merged.get("synchronous", "FULL")).upper()
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise InvalidInput(
                "synchronous",
                "choice",
                f"synchronous must be one of {list(SYNCHRONOUS_LEVELS)}, got {synchronous!r}",
            )
        busy_timeout_ms = _positive_number(merged.get("busy_timeout_ms", 5000), "busy_timeout_ms")
        return SqliteStore(url, parsed.target, synchronous, int(busy_timeout_ms))
    from eventstore.postgres_store import PostgresStore

    _reject_unknown(options, ("pool_max_size", "connect_timeout_s"), "postgresql")
    pool_max_size = int(_positive_number(options.get("pool_max_size", 10), "pool_max_size"))
    connect_timeout_s = _positive_number(
        options.get("connect_timeout_s", 10.0), "connect_timeout_s"
    )
    return PostgresStore(parsed.target, pool_max_size, connect_timeout_s)


def _reject_unknown(options: dict[str, Any], known: tuple[str, ...], dialect: str) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidInput(
            "options",
            "unknown",
            f"unknown {dialect} store option(s) {unknown}; known: {list(known)}",
        )


def _positive_number(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or not number > 0:
        raise InvalidInput(name, "positive", f"{name} must be a positive number, got {value!r}")
    return number
