"""The run path's retry policy (actors.retrying), on a real store: a unit is tried
again only for what its policy names, at most its number of tries, each try in a
transaction of its own."""

from __future__ import annotations

import pytest

import qlflow
from actors.retrying import DECIDE_AGAIN, replay_once
from domain.errors import InvalidInput, VersionConflict


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def failing(times: int, error: Exception):
    calls: list[int] = []

    def unit(tx):
        calls.append(tx.clock_ms())
        if len(calls) <= times:
            raise error
        return len(calls)

    return unit, calls


def test_a_version_conflict_is_decided_again_until_it_passes(rt):
    unit, calls = failing(3, VersionConflict("run-x", 3, 4))
    assert DECIDE_AGAIN.execute(rt._authority, unit, "complete") == 4
    assert len(calls) == 4


def test_decide_again_gives_up_after_its_tries(rt):
    unit, calls = failing(DECIDE_AGAIN.tries, VersionConflict("run-x", 3, 4))
    with pytest.raises(VersionConflict):
        DECIDE_AGAIN.execute(rt._authority, unit, "complete")
    assert len(calls) == DECIDE_AGAIN.tries


@pytest.mark.parametrize("error", [InvalidInput("x", "bad", "no"), RuntimeError("boom")])
def test_decide_again_answers_anything_else_at_once(rt, error):
    unit, calls = failing(1, error)
    with pytest.raises(type(error)):
        DECIDE_AGAIN.execute(rt._authority, unit, "complete")
    assert len(calls) == 1


def test_replay_once_tries_one_more_time_but_never_after_a_refusal(rt):
    policy = replay_once((InvalidInput,))
    unit, calls = failing(1, RuntimeError("connection dropped"))
    assert policy.execute(rt._authority, unit, "admission") == 2
    unit, calls = failing(2, RuntimeError("connection dropped"))
    with pytest.raises(RuntimeError):
        policy.execute(rt._authority, unit, "admission")
    assert len(calls) == 2
    unit, calls = failing(1, InvalidInput("params", "unknown", "no such parameter"))
    with pytest.raises(InvalidInput):
        policy.execute(rt._authority, unit, "admission")
    assert len(calls) == 1
