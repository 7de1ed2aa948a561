"""The operation authority: the one place store transactions are executed.

SQLite allows one writer. Instead of many connections fighting for the write
lock, one authority actor owns the only connection and runs each unit of work
(`BEGIN IMMEDIATE` … `COMMIT`) in turn; callers block on its answer. On
PostgreSQL there is nothing to serialize here: each unit of work runs on the
caller's thread with a pooled connection, and the adapter's locks do the rest.

A unit of work is a callable `fn(tx) -> result`. It runs inside one transaction
that commits when it returns and rolls back when it raises. A read is a callable
`fn(session)` run in a read session, which takes no write lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pykka

from eventstore import faults

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Outcome:
    value: Any = None
    error: BaseException | None = None


def run_unit(store, fn: Callable[[Any], T], name: str = "unit") -> T:
    """Run `fn` in one store transaction, with the named fault points around it."""
    faults.hit(f"{name}.before_begin")
    with store.transaction() as tx:
        faults.hit(f"{name}.after_begin")
        value = fn(tx)
        faults.hit(f"{name}.before_commit")
    faults.hit(f"{name}.after_commit")
    return value


def run_read(store, fn: Callable[[Any], T]) -> T:
    """Run `fn` in a read session of the store (no write lock, no fault points:
    a read leaves nothing behind to recover)."""
    with store.session() as session:
        return fn(session)


class _AuthorityActor(pykka.ThreadingActor):
    """Owns the SQLite connection; executes units of work one at a time."""

    def __init__(self, store) -> None:
        super().__init__()
        self._store = store

    def on_receive(self, message: Any) -> _Outcome:
        fn, name = message
        # An exception escaping on_receive would stop this actor for good; hand
        # every failure back to the caller instead.
        try:
            if name is None:
                return _Outcome(value=run_read(self._store, fn))
            return _Outcome(value=run_unit(self._store, fn, name))
        except BaseException as error:
            return _Outcome(error=error)


class OperationAuthority:
    """Executes units of work: on the authority actor (SQLite) or inline (PostgreSQL)."""

    def __init__(self, store) -> None:
        self.store = store
        self._actor = _AuthorityActor.start(store) if store.dialect == "sqlite" else None

    def execute(self, fn: Callable[[Any], T], name: str = "unit") -> T:
        """Run `fn(tx)` in one transaction and return its result (or raise its error)."""
        if self._actor is None:
            return run_unit(self.store, fn, name)
        return self._ask(fn, name)

    def read(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(session)` in a read session and return its result."""
        if self._actor is None:
            return run_read(self.store, fn)
        return self._ask(fn, None)

    def _ask(self, fn: Callable[[Any], T], name: str | None) -> T:
        outcome: _Outcome = self._actor.ask((fn, name))
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def stop(self) -> None:
        """Stop the authority actor (if any); the store stays open."""
        if self._actor is not None:
            self._actor.stop()
            self._actor = None
