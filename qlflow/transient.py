"""Which errors are worth another try: a busy or unreachable database."""

from __future__ import annotations

import sqlite3
import sys


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors worth another try: a busy or unreachable database. PostgreSQL's are
    included only once a PostgreSQL store has loaded its driver."""
    errors: list[type[BaseException]] = [sqlite3.OperationalError]
    if "psycopg" in sys.modules:
        import psycopg
        from psycopg_pool import PoolTimeout

        errors += [psycopg.OperationalError, PoolTimeout]
    return tuple(errors)
