"""Units that all join one open transaction: the benches seed many Runs at once by
running Workflow turns and worker writes inside one caller's transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from actors.aggregate_cache import AggregateCache
from actors.authority import Units
from actors.planned_workflows import PlannedWorkflows
from eventstore.api import Transaction

T = TypeVar("T")


class InTransaction:
    """`actors.authority.Units` on one open transaction (bench seeding only)."""

    def __init__(self, tx: Transaction) -> None:
        self.tx = tx
        self.store = tx  # candidate queries read through the open transaction
        # what the units leave is committed with the caller's transaction
        self.aggregates = AggregateCache()
        self.workflows = PlannedWorkflows()

    def execute(self, fn: Callable[[Transaction], T], name: str = "unit") -> T:
        return fn(self.tx)

    def read(self, fn: Callable[[Transaction], T]) -> T:
        return fn(self.tx)

    def run(self, fn: Callable[[Units], T]) -> T:
        return fn(self)
