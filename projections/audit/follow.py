"""Following the log: every new event as it commits, in position order."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from domain.records import Record
from eventstore.api import EventStore


def follow(
    store: EventStore,
    after_position: int = 0,
    *,
    batch: int = 1000,
    poll_interval_s: float = 0.2,
    stop: Callable[[], bool] | None = None,
    types: Sequence[str] | None = None,
) -> Iterator[Record]:
    """Yield every event after `after_position` as it commits, in position order.

    Never skips one: positions become visible in order on both stores (see
    eventstore.postgres_store), so asking for positions after the last one seen is
    enough. When caught up it asks `stop()`; once that says True it reads what has
    committed meanwhile and returns (without `stop`, it follows forever)."""
    wanted = frozenset(types) if types is not None else None
    position = after_position
    stopping = False
    while True:
        records = store.read_all(position, batch)
        for record in records:
            position = record.global_position
            if wanted is None or record.type in wanted:
                yield record
        if len(records) == batch:
            continue
        if stopping:
            return
        if stop is not None and stop():
            stopping = True  # one more read: what committed before stop() said so
            continue
        time.sleep(poll_interval_s)
