"""What every part of `Runtime` stands on: its store, its operation authority, and
the instant a call decides at."""

from __future__ import annotations

from actors.authority import OperationAuthority
from eventstore import BaseStore
from qlflow.arguments import instant


class StoreBound:
    """The base of `Runtime` and of the parts mixed into it (`Inspection`,
    `Scheduling`)."""

    store: BaseStore
    _authority: OperationAuthority

    def clock_ms(self) -> int:
        """The store's time as last seen (docs/DESIGN.md, "One clock per store"): what
        every call without `now_ms` decides at — PostgreSQL's clock, read by each write
        in the round trip of its first statement and estimated between writes from
        this host's clock; SQLite's host clock."""
        return self.store.clock_ms()

    def _now(self, now_ms: int | None) -> int:
        """`now_ms` as given (checked), or the store's time as last seen."""
        return self.clock_ms() if now_ms is None else instant("now_ms", now_ms)
