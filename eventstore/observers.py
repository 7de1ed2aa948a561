"""What a store tells its observers: each committed write transaction and each
error it raised as StoreUnavailable (docs/DESIGN.md, "Observability").

An observer is how metrics, logs and traces learn what happened without a hook in
every place it happens: the records a commit appended say it (a lease granted, a
step finished, a schedule fired). Observers are called after COMMIT answered, on
the committing thread, so they must be quick; one that raises is logged and the
write is still answered as it was.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from domain.records import Record

log = logging.getLogger("qlflow.eventstore")


@dataclass(frozen=True, slots=True)
class Commit:
    """One committed write transaction: the records it appended (an exact replay
    appends none), how long it took from BEGIN to COMMIT's answer, and how often it
    waited for the database (PostgreSQL: round trips; SQLite: statements)."""

    records: Sequence[Record]
    seconds: float
    round_trips: int


CommitObserver = Callable[[Commit], None]
ErrorObserver = Callable[[str], None]  # the StoreUnavailable reason


class Observers:
    """The observers of one store; adding or removing one is safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commits: tuple[CommitObserver, ...] = ()
        self._errors: tuple[ErrorObserver, ...] = ()

    @property
    def active(self) -> bool:
        """Whether anyone listens to commits (else a commit builds no `Commit`)."""
        return bool(self._commits)

    def on_commit(self, observer: CommitObserver) -> Callable[[], None]:
        """Call `observer` after every commit; returns what removes it again."""
        with self._lock:
            self._commits = (*self._commits, observer)

        def remove() -> None:
            with self._lock:
                self._commits = tuple(o for o in self._commits if o is not observer)

        return remove

    def on_error(self, observer: ErrorObserver) -> Callable[[], None]:
        """Call `observer(reason)` for every StoreUnavailable the store raises."""
        with self._lock:
            self._errors = (*self._errors, observer)

        def remove() -> None:
            with self._lock:
                self._errors = tuple(o for o in self._errors if o is not observer)

        return remove

    def committed(self, commit: Commit) -> None:
        for observer in self._commits:
            try:
                observer(commit)
            except Exception:  # an observer never changes a write's answer
                log.exception("a commit observer failed")

    def failed(self, reason: str) -> None:
        for observer in self._errors:
            try:
                observer(reason)
            except Exception:
                log.exception("a store error observer failed")
