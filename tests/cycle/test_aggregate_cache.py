"""The Runs a process keeps as its commits left them (actors.aggregate_cache): the
newest of each, least recently used first out past a weight, never a finished Run."""

from __future__ import annotations

import pytest

import qlflow
from actors.aggregate_cache import AggregateCache
from tests.cycle.helpers import DIAMOND, T0, manifest


@pytest.fixture
def aggregates(sqlite_url):
    """(a Run at two versions, two more Runs, a finished Run) as folded from the log."""
    with qlflow.open(sqlite_url) as rt:
        rt.publish(manifest(DIAMOND), now_ms=T0)
        runs = [rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0).run_id for i in range(4)]
        first = rt.aggregate_at(runs[0])
        rt.lease_attempts("w1", now_ms=T0, run_id=runs[0], start=True)
        later = rt.aggregate_at(runs[0])
        rt.cancel(runs[3], now_ms=T0)
        return (
            first,
            later,
            rt.aggregate_at(runs[1]),
            rt.aggregate_at(runs[2]),
            rt.aggregate_at(runs[3]),
        )


def weight(aggregate) -> int:
    return 1 + len(aggregate.steps) + len(aggregate.attempts)


def test_the_newest_of_a_run_stays_and_an_older_answer_is_ignored(aggregates):
    first, later, *_ = aggregates
    cache = AggregateCache()
    cache.put([later])
    cache.put([first])  # an answer that came back after a newer one
    assert cache.get(first.run_id) is later
    cache.put([first, later])
    assert cache.get(first.run_id) is later and len(cache) == 1


def test_a_finished_run_leaves_and_is_never_held(aggregates):
    *_, cancelled = aggregates
    assert cancelled.run.is_terminal
    cache = AggregateCache()
    cache.put([cancelled])
    assert cache.get(cancelled.run_id) is None and len(cache) == 0


def test_the_least_recently_used_leave_past_the_weight(aggregates):
    _, later, second, third, _ = aggregates
    cache = AggregateCache(capacity=weight(later) + weight(second))
    cache.put([later, second])
    assert cache.get(later.run_id) is later  # now the most recently used
    cache.put([third])
    assert cache.get(second.run_id) is None  # the least recently used left
    assert cache.get(later.run_id) is later and cache.get(third.run_id) is third
    cache.clear()
    assert len(cache) == 0
