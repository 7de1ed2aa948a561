"""The retention policy a host runs after each cycle, on both stores: at most one
bounded batch per tick (every tick while batches come full, else every ten minutes),
the Runs it removed handed on (the host deletes their local
logs), step logs pruned; a bad age or config is a typed error."""

from __future__ import annotations

import pytest

import qlflow
from domain import streams
from domain.errors import InvalidInput
from eventstore import logs
from qlflow.retention_policy import (
    RECLAIM_EVERY_MS,
    RETAIN_EVERY_MS,
    RetentionPolicy,
    from_config,
    from_table,
    parse_age,
)
from tests.rerun.support import T0
from tests.retention.support import DAY, finished_runs


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def test_each_tick_removes_at_most_one_batch(rt):
    run_ids = finished_runs(rt, 5)
    handed: list[list[str]] = []
    policy = RetentionPolicy(finished_runs_ms=DAY, batch=2, on_removed=handed.append)
    now = T0 + 2 * DAY

    removed = [policy.tick(rt, now).run_ids for _ in range(3)]

    assert removed == [run_ids[:2], run_ids[2:4], run_ids[4:]]
    assert handed == removed
    assert rt.verify_projections().ok


def test_after_a_batch_that_was_not_full_the_next_waits_ten_minutes(rt):
    run_ids = finished_runs(rt, 4, spacing_ms=60_000)
    policy = RetentionPolicy(finished_runs_ms=DAY, batch=2)
    first = T0 + DAY + 1  # only the first Run finished a day ago

    assert policy.tick(rt, first).run_ids == run_ids[:1]  # not full: no backlog
    # Runs come due each minute; no batch (no record) for each of them
    assert policy.tick(rt, first + 3 * 60_000) is None
    assert policy.tick(rt, first + RETAIN_EVERY_MS - 1) is None
    # ten minutes on: one batch takes what came due meanwhile, full: the next goes at once
    assert policy.tick(rt, first + RETAIN_EVERY_MS).run_ids == run_ids[1:3]
    assert policy.tick(rt, first + RETAIN_EVERY_MS).run_ids == run_ids[3:]
    assert policy.tick(rt, first + RETAIN_EVERY_MS + 1) is None
    assert len(rt.store.read_stream(streams.retention_stream())) == 3


def test_the_space_removed_runs_held_is_reclaimed_at_most_every_hour(rt):
    run_ids = finished_runs(rt, 4)
    policy = RetentionPolicy(finished_runs_ms=DAY, batch=1)
    first = T0 + 2 * DAY

    assert policy.tick(rt, first).run_ids == run_ids[:1]
    assert policy.reclaimed_at == first  # the first removal reclaims at once
    # within the hour the next batches remove Runs and reclaim nothing
    assert policy.tick(rt, first + 1).run_ids == run_ids[1:2]
    assert policy.tick(rt, first + RECLAIM_EVERY_MS - 1).run_ids == run_ids[2:3]
    assert policy.reclaimed_at == first
    # an hour on, the tick reclaims what the batches since freed
    assert policy.tick(rt, first + RECLAIM_EVERY_MS).run_ids == run_ids[3:]
    assert policy.reclaimed_at == first + RECLAIM_EVERY_MS
    # nothing removed since: nothing to reclaim, however long after
    assert policy.tick(rt, first + 5 * RECLAIM_EVERY_MS).run_ids == []
    assert policy.reclaimed_at == first + RECLAIM_EVERY_MS
    assert rt.verify_projections().ok


def test_a_policy_told_not_to_reclaim_leaves_it_to_autovacuum(rt):
    run_ids = finished_runs(rt, 2)
    policy = RetentionPolicy(finished_runs_ms=DAY, reclaim_every_ms=None)
    assert policy.tick(rt, T0 + 2 * DAY).run_ids == run_ids
    assert policy.reclaimed_at is None


def test_nothing_finished_long_enough_ago_stays(rt):
    finished_runs(rt, 2)
    policy = RetentionPolicy(finished_runs_ms=30 * DAY)
    assert policy.tick(rt, T0 + DAY).run_ids == []


def test_logs_are_pruned_by_their_last_write_at_most_every_ten_minutes(rt):
    (run_id,) = finished_runs(rt, 1)
    old, new = (a.attempt_id for a in rt.get_run(run_id).steps["fetch"].attempts[:1] * 2)
    rt.append_log(old, [("stdout", T0, b"hello\n")])
    policy = RetentionPolicy(logs_ms=DAY)

    assert policy.tick(rt, T0 + 2 * DAY) is None  # no Runs policy: no report
    assert logs.state(rt.store, old) is None
    rt.append_log(new, [("stdout", T0, b"again\n")])
    policy.tick(rt, T0 + 2 * DAY + 60_000)  # pruned a minute ago: not yet
    assert logs.state(rt.store, new) is not None
    policy.tick(rt, T0 + 2 * DAY + 600_000)
    assert logs.state(rt.store, new) is None
    assert rt.get_run(run_id).status == "succeeded"  # logs only: the Run stays


def test_a_config_table_and_ages(tmp_path):
    config = tmp_path / "host.toml"
    config.write_text('[retention]\nfinished_runs = "30d"\nlogs = "7d"\n')
    policy = from_config(config)
    assert (policy.finished_runs_ms, policy.logs_ms) == (30 * DAY, 7 * DAY)
    assert parse_age("x", "1h30m") == 5_400_000
    (tmp_path / "empty.toml").write_text("[host]\nname = 'a'\n")
    assert from_config(tmp_path / "empty.toml").active is False


@pytest.mark.parametrize("age", ["0d", "", "30", "d", "-5d", "30x", 30, None])
def test_a_bad_age_is_a_typed_error(age):
    with pytest.raises(InvalidInput):
        from_table({"finished_runs": age} if age is not None else {"finished_runs": []})


def test_a_bad_config_is_a_typed_error(tmp_path):
    for text in ("[retention]\nfinished = 1\n", "retention = 3\n", "not toml ["):
        path = tmp_path / "bad.toml"
        path.write_text(text)
        with pytest.raises(InvalidInput):
            from_config(path)
    with pytest.raises(InvalidInput):
        from_config(tmp_path / "missing.toml")
    with pytest.raises(InvalidInput):
        RetentionPolicy(finished_runs_ms=0)


@pytest.mark.parametrize("every", [0, -1, True, "1h"])
def test_a_bad_reclaim_interval_is_a_typed_error(every):
    with pytest.raises(InvalidInput, match="reclaim_every_ms"):
        RetentionPolicy(finished_runs_ms=DAY, reclaim_every_ms=every)
