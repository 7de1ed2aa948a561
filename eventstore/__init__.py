"""Append-only event store: one contract (`api`), SQLite and PostgreSQL adapters::

store = eventstore.open_store("sqlite:///qlflow.db")
store = eventstore.open_store("postgresql://user@host/db", pool_max_size=20)

This package is the only one that knows which database it runs on: callers use the
contract's verbs (append, reads, locks, replay sessions) and `store.single_writer`.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from domain.errors import DurabilityWarning, InvalidInput, LockTimeout, StoreUnavailable
from eventstore.api import (
    EventStore,
    MigrationStep,
    Reads,
    ReplaySession,
    StoreUsageError,
    Transaction,
)
from eventstore.locks import DEFAULT_LOCK_TIMEOUT_MS
from eventstore.store import BaseStore
from eventstore.url import POSTGRESQL, SQLITE, database_file, parse_store_url, store_kind

__all__ = [
    "POSTGRESQL",
    "SQLITE",
    "BaseStore",
    "EventStore",
    "MigrationStep",
    "Reads",
    "ReplaySession",
    "StoreUsageError",
    "Transaction",
    "database_file",
    "denied_errors",
    "driver_errors",
    "open_store",
    "store_kind",
    "transient_errors",
]


def open_store(url: str, *, read_only: bool = False, **options: Any) -> BaseStore:
    """Open (creating and migrating as needed) the event store at `url`.

    `read_only=True` opens an existing store for reads and never creates, converts,
    migrates or write-locks it: a missing store is NotFound, a database that is not
    a qlflow store (or is behind or ahead of this code) a SchemaError, and any
    transaction a StoreUsageError.

    SQLite options: `synchronous` ("FULL" default, "NORMAL", "OFF", "EXTRA"; NORMAL and
    OFF may lose acknowledged writes on power loss: a DurabilityWarning says so),
    `busy_timeout_ms` (5000) — also accepted in the URL query string.
    PostgreSQL options: `pool_max_size` (10), `connect_timeout_s` (10),
    `lock_timeout_ms` (5000: the longest `lock` or a waiting `lock_heads` waits).
    Raises InvalidInput for an unknown scheme or option, StoreUnavailable when the
    database cannot be reached or used right now."""
    if not isinstance(read_only, bool):
        raise InvalidInput("read_only", "bool", f"read_only must be a bool, got {read_only!r}")
    parsed = parse_store_url(url)
    if parsed.kind == SQLITE:
        from eventstore.sqlite_store import SYNCHRONOUS_LEVELS, SYNCHRONOUS_LOSSES, SqliteStore

        merged = {**parsed.options, **options}
        _reject_unknown(merged, ("synchronous", "busy_timeout_ms"), "sqlite")
        synchronous = str(merged.get("synchronous", "FULL")).upper()
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise InvalidInput(
                "synchronous",
                "choice",
                f"synchronous must be one of {list(SYNCHRONOUS_LEVELS)}, got {synchronous!r}",
            )
        if synchronous in SYNCHRONOUS_LOSSES and not read_only:
            warnings.warn(
                f"SQLite synchronous={synchronous}: {SYNCHRONOUS_LOSSES[synchronous]}; "
                "FULL (the default) keeps every acknowledged write",
                DurabilityWarning,
                stacklevel=2,
            )
        busy_timeout_ms = _positive_number(merged.get("busy_timeout_ms", 5000), "busy_timeout_ms")
        return SqliteStore(url, parsed.target, synchronous, int(busy_timeout_ms), read_only)
    from eventstore.postgres_store import PostgresStore

    _reject_unknown(options, ("pool_max_size", "connect_timeout_s", "lock_timeout_ms"), POSTGRESQL)
    pool_max_size = int(_positive_number(options.get("pool_max_size", 10), "pool_max_size"))
    connect_timeout_s = _positive_number(
        options.get("connect_timeout_s", 10.0), "connect_timeout_s"
    )
    lock_timeout_ms = int(
        _positive_number(options.get("lock_timeout_ms", DEFAULT_LOCK_TIMEOUT_MS), "lock_timeout_ms")
    )
    return PostgresStore(
        parsed.target, pool_max_size, connect_timeout_s, lock_timeout_ms, read_only
    )


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors worth another try: the store unavailable right now (StoreUnavailable:
    unreachable, busy, disk full, read-only), or a lock not granted in time. The
    store raises its drivers' such errors as StoreUnavailable; the drivers' own
    classes are listed too, for the few places that meet them raw (a replay session).
    PostgreSQL's are included only once a PostgreSQL store has loaded its driver (an
    embedded process never imports it)."""
    import sqlite3

    errors: list[type[BaseException]] = [StoreUnavailable, LockTimeout, sqlite3.OperationalError]
    if "psycopg" in sys.modules:
        import psycopg
        from psycopg_pool import PoolTimeout

        errors += [psycopg.OperationalError, PoolTimeout]
    return tuple(errors)


def driver_errors() -> tuple[type[BaseException], ...]:
    """The base errors of the database drivers loaded so far (what a database itself
    may raise: a refused connection, a permission denied), for callers that report
    them instead of crashing."""
    import sqlite3

    errors: list[type[BaseException]] = [sqlite3.Error]
    if "psycopg" in sys.modules:
        import psycopg

        errors.append(psycopg.Error)
    return tuple(errors)


def denied_errors() -> tuple[type[BaseException], ...]:
    """The errors a database raises when the connected role lacks a privilege
    (PostgreSQL's least-privilege roles), for the drivers loaded so far; SQLite has no
    privileges, so none of its own."""
    if "psycopg" not in sys.modules:
        return ()
    from psycopg import errors

    return (errors.InsufficientPrivilege,)


def _reject_unknown(options: dict[str, Any], known: tuple[str, ...], kind: str) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidInput(
            "options",
            "unknown",
            f"unknown {kind} store option(s) {unknown}; known: {list(known)}",
        )


def _positive_number(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or not number > 0:
        raise InvalidInput(name, "positive", f"{name} must be a positive number, got {value!r}")
    return number
