"""The operation authority: the one place store transactions are executed.

A store that admits one writer at a time (`store.single_writer`, SQLite) gets one
authority actor that runs each unit of work (`BEGIN IMMEDIATE` … `COMMIT`) in turn
on its thread, instead of many threads queueing for the write lock; callers block
on its answer. Otherwise (PostgreSQL) there is nothing to serialize here: each unit
of work runs on the caller's thread with a pooled connection, and the store's locks
do the rest.

A unit of work is a callable `fn(tx) -> result`. It runs inside one transaction
that commits when it returns and rolls back when it raises. A read is a callable
`fn(session)` run in a read session, which takes no write lock. Everything that
takes units (a Workflow's turn, worker writes, admission) is written against the
`Units` protocol, which `OperationAuthority` and `LocalUnits` both satisfy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import pykka

from actors.aggregate_cache import AggregateCache
from actors.planned_workflows import PlannedWorkflows
from eventstore import faults
from eventstore.api import EventStore, Reads, Transaction

T = TypeVar("T")


class Units(Protocol):
    """Where units of work and reads run."""

    @property
    def store(self) -> Reads:
        """What candidate queries read outside any unit (a store, or an open transaction)."""
        ...

    @property
    def aggregates(self) -> AggregateCache:
        """The Runs as this process's commits left them (`actors.aggregate_cache`)."""
        ...

    @property
    def workflows(self) -> PlannedWorkflows:
        """The Workflows this process has checked for admission."""
        ...

    def execute(self, fn: Callable[[Transaction], T], name: str = "unit") -> T:
        """Run `fn(tx)` in one transaction and return its result (or raise its error)."""
        ...

    def read(self, fn: Callable[[Transaction], T]) -> T:
        """Run `fn(session)` in a read session and return its result."""
        ...

    def run(self, fn: Callable[[Units], T]) -> T:
        """Run `fn(units)`, which may read and execute several units, as one turn."""
        ...


@dataclass(frozen=True, slots=True)
class _Outcome:
    value: Any = None
    error: BaseException | None = None


def run_unit(store: EventStore, fn: Callable[[Transaction], T], name: str = "unit") -> T:
    """Run `fn` in one store transaction, with the named fault points around it."""
    faults.hit(f"{name}.before_begin")
    with store.transaction() as tx:
        faults.hit(f"{name}.after_begin")
        value = fn(tx)
        faults.hit(f"{name}.before_commit")
    faults.hit(f"{name}.after_commit")
    return value


def run_read(store: EventStore, fn: Callable[[Transaction], T]) -> T:
    """Run `fn` in a read session of the store (no write lock, no fault points:
    a read leaves nothing behind to recover)."""
    with store.session() as session:
        return fn(session)


class LocalUnits:
    """Units of work and reads run on the calling thread, straight on the store."""

    def __init__(
        self,
        store: EventStore,
        aggregates: AggregateCache | None = None,
        workflows: PlannedWorkflows | None = None,
    ) -> None:
        self.store = store
        self.aggregates = aggregates if aggregates is not None else AggregateCache()
        self.workflows = workflows if workflows is not None else PlannedWorkflows()

    def execute(self, fn: Callable[[Transaction], T], name: str = "unit") -> T:
        """Run `fn(tx)` in one transaction (see run_unit)."""
        return run_unit(self.store, fn, name)

    def read(self, fn: Callable[[Transaction], T]) -> T:
        """Run `fn(session)` in a read session (see run_read)."""
        return run_read(self.store, fn)

    def run(self, fn: Callable[[Units], T]) -> T:
        """Run `fn(self)` here: the calling thread is already the turn's own."""
        return fn(self)


class _AuthorityActor(pykka.ThreadingActor):
    """Owns the store's one writer; runs what it is handed one at a time."""

    # A host that never calls close() must still be able to exit: the runtime's
    # atexit hook stops this actor and closes the store, and a daemon thread keeps
    # the interpreter from waiting on it forever before that hook runs.
    use_daemon_thread = True

    def __init__(self, units: LocalUnits) -> None:
        super().__init__()
        self._units = units

    def on_receive(self, message: Any) -> _Outcome:
        # An exception escaping on_receive would stop this actor for good; hand
        # every failure back to the caller instead.
        try:
            return _Outcome(value=message(self._units))
        except BaseException as error:
            return _Outcome(error=error)


class OperationAuthority:
    """Where units of work run: on the authority actor (a single-writer store) or on
    the calling thread."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.aggregates = AggregateCache()
        self.workflows = PlannedWorkflows()
        self._local = LocalUnits(store, self.aggregates, self.workflows)
        self._actor = _AuthorityActor.start(self._local) if store.single_writer else None

    def run(self, fn: Callable[[Units], T]) -> T:
        """Run `fn(units)`, which may read and execute several units, as one turn: on a
        single-writer store the authority runs it whole, in turn with every other
        call, so a Workflow's read, decision and write cost one hand-over between
        threads."""
        if self._actor is None:
            return fn(self._local)
        outcome = cast(_Outcome, self._actor.ask(fn))
        if outcome.error is not None:
            raise outcome.error
        value: T = outcome.value
        return value

    def execute(self, fn: Callable[[Transaction], T], name: str = "unit") -> T:
        """Run `fn(tx)` in one transaction and return its result (or raise its error)."""
        return self.run(lambda units: units.execute(fn, name))

    def read(self, fn: Callable[[Transaction], T]) -> T:
        """Run `fn(session)` in a read session and return its result."""
        return self.run(lambda units: units.read(fn))

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the authority actor (if any) once the unit it runs ends, waiting at most
        `timeout_s` (None: as long as it takes); the store stays open."""
        actor, self._actor = self._actor, None
        if actor is not None:
            with contextlib.suppress(pykka.Timeout, pykka.ActorDeadError):
                actor.stop(timeout=timeout_s)
