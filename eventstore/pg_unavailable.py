"""PostgreSQL errors that mean "not now" (StoreUnavailable), and the session setup
of every pooled connection (bounded lock waits, read-only sessions, array dumpers)."""

from __future__ import annotations

import psycopg
import psycopg_pool

from domain.errors import StoreUnavailable
from eventstore import pg_arrays

# The planner's price of a random page read, at most (the server's own setting where
# it is lower): the store's hot tables are read by key and stay in shared buffers
# (docs/DESIGN.md "A fresh store")
RANDOM_PAGE_COST = 1.1


def bounded_session(lock_timeout_ms: int, read_only: bool, conn: psycopg.Connection) -> None:
    """Every lock wait of the connection is bounded (a lock held by another session,
    an audit role's advisory lock included, is an error after `lock_timeout_ms`, never
    a hang); every transaction of a read-only store's connections is READ ONLY; a
    random page read is priced for cached tables (`RANDOM_PAGE_COST`). It sends the
    store's arrays in one pass (`eventstore.pg_arrays`)."""
    pg_arrays.register(conn)
    conn.execute(f"SET lock_timeout = {int(lock_timeout_ms)}")
    conn.execute(
        "SELECT set_config('random_page_cost', "
        "least(current_setting('random_page_cost')::float8, %s)::text, false)",
        (RANDOM_PAGE_COST,),
    )
    if read_only:
        conn.execute("SET default_transaction_read_only = on")
    conn.commit()


def unavailable(error: BaseException, where: str) -> StoreUnavailable | None:
    """StoreUnavailable for a PostgreSQL error that means "not now" (a lost or refused
    connection, a server shutting down, no disk space, a standby, a serialization
    failure or deadlock), else None. A refused login or a missing database is not
    "not now": those stay the driver's errors."""
    if isinstance(error, psycopg_pool.PoolTimeout):
        reason = "unreachable"
    elif isinstance(error, psycopg.Error) and (
        error.sqlstate in _UNAVAILABLE
        or (error.sqlstate is None and isinstance(error, psycopg.OperationalError))
        or (error.sqlstate or "")[:2] == "08"
    ):
        reason = _UNAVAILABLE.get(error.sqlstate or "", "unreachable")
    else:
        return None
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return StoreUnavailable(reason, f"PostgreSQL ({where}): {first} — {_WHAT_TO_DO[reason]}")


_UNAVAILABLE = {
    "53100": "disk_full",  # disk_full
    "53200": "busy",  # out_of_memory
    "53300": "busy",  # too_many_connections
    "57P01": "unreachable",  # admin_shutdown (pg_terminate_backend, a restart)
    "57P02": "unreachable",  # crash_shutdown
    "57P03": "unreachable",  # cannot_connect_now
    "57P05": "unreachable",  # idle_session_timeout
    "57014": "busy",  # query_canceled (statement_timeout)
    "55P03": "busy",  # lock_not_available
    "40001": "busy",  # serialization_failure
    "40P01": "busy",  # deadlock_detected
    "25006": "read_only",  # read_only_sql_transaction (a standby after a failover)
}
_WHAT_TO_DO = {
    "unreachable": "the connection was lost or refused; try again",
    "busy": "the server is busy; try again",
    "disk_full": "the server is out of disk space; free some and try again",
    "read_only": "the server takes no writes (a standby?); try again",
}
