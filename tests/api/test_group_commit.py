"""Group commit on both stores: completions that threads make at the same time share
one commit, each decided, fenced and answered on its own; a caller alone writes at
once."""

from __future__ import annotations

import threading
import time

import pytest

import qlflow
from eventstore import faults
from qlflow.errors import FenceError, InvalidInput, NotFound

WIDTH = 4


def manifest() -> dict:
    return {
        "package": {"name": "wide", "publisher": "acme"},
        "tasks": {"t": {"command": ["sh", "-c", "exit 0"]}},
        "workflows": {
            "w": {"steps": [{"key": f"s{i}", "task": "t"} for i in range(WIDTH)]},
        },
    }


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime
    faults.disarm()


def _running_leases(rt) -> list:
    rt.publish(manifest())
    rt.start("wide", "w", admission_key="k")
    leases = rt.lease_attempts("w1", limit=WIDTH, ttl_ms=60_000, start=True)
    assert len(leases) == WIDTH
    return [rt.mark_running(lease) for lease in leases]


def _hold_first_commit_until(rt, queued: int) -> None:
    """The first completion's transaction waits (inside it) until `queued` others
    have arrived behind it, so they are written together next."""
    group = rt._completions._group

    def wait_for_followers() -> None:
        deadline = time.monotonic() + 20
        while group.queued < queued:
            assert time.monotonic() < deadline, f"{group.queued} of {queued} queued"
            time.sleep(0.001)

    faults.arm("complete.after_begin", wait_for_followers, nth=1)


def _complete_together(rt, calls) -> list:
    """Run each `(lease, outcome)` completion on its own thread: the first alone,
    the rest once it holds its transaction. Returns each answer or error."""
    answers: list = [None] * len(calls)

    def call(index: int) -> None:
        lease, outcome = calls[index]
        try:
            answers[index] = rt.complete(lease, outcome)
        except Exception as error:  # each thread's own answer, errors included
            answers[index] = error

    first = threading.Thread(target=call, args=(0,))
    first.start()
    group = rt._completions._group
    deadline = time.monotonic() + 20
    while group.batches < 1:  # the first is writing
        assert time.monotonic() < deadline
        time.sleep(0.001)
    rest = [threading.Thread(target=call, args=(i,)) for i in range(1, len(calls))]
    for thread in rest:
        thread.start()
    for thread in (first, *rest):
        thread.join(30)
        assert not thread.is_alive()
    return answers


def test_completions_that_arrive_together_share_one_commit(rt):
    leases = _running_leases(rt)
    _hold_first_commit_until(rt, WIDTH - 1)
    before = rt._completions.batches
    answers = _complete_together(rt, [(lease, "succeeded") for lease in leases])
    assert answers == ["succeeded"] * WIDTH
    assert rt._completions.batches - before == 2  # the first alone, the other three in one
    run = rt.get_run(leases[0].run_id)
    assert run.status == "succeeded"
    assert all(step.status == "succeeded" for step in run.steps.values())
    assert rt.verify_projections().ok


def test_a_bad_completion_in_a_group_is_refused_alone(rt):
    leases = _running_leases(rt)
    _hold_first_commit_until(rt, WIDTH - 1)
    calls = [(leases[0], "succeeded"), (leases[1], "bogus"), *((x, "failed") for x in leases[2:])]
    answers = _complete_together(rt, calls)
    assert answers[0] == "succeeded"
    assert isinstance(answers[1], InvalidInput)
    assert answers[2:] == ["failed"] * (WIDTH - 2)
    run = rt.get_run(leases[0].run_id)
    assert run.steps[leases[1].step_key].status == "running"  # nothing written for it


def test_a_fenced_completion_in_a_group_is_answered_alone(rt):
    leases = _running_leases(rt)
    stale = leases[1]
    rt.renew(stale)  # a new lease version: the old one is fenced
    _hold_first_commit_until(rt, WIDTH - 1)
    answers = _complete_together(rt, [(lease, "succeeded") for lease in leases])
    assert isinstance(answers[1], FenceError)
    assert [answers[0], *answers[2:]] == ["succeeded"] * (WIDTH - 1)


def test_a_completion_alone_is_written_at_once_in_its_own_commit(rt):
    leases = _running_leases(rt)
    before = rt._completions.batches
    for lease in leases:
        assert rt.complete(lease, "succeeded") == "succeeded"
    assert rt._completions.batches - before == WIDTH


# --- start barriers and renewals (docs/DESIGN.md "Group commit") -------------------------


def _together(rt, unit: str, calls, group=None) -> list:
    """Run each call on its own thread: the first alone, holding its transaction (at
    `<unit>.after_begin`) until the others queue behind it in `group` (the worker
    writes' by default). Returns each answer or error."""
    group = group if group is not None else rt._worker_writes._group
    answers: list = [None] * len(calls)

    def wait_for_followers() -> None:
        deadline = time.monotonic() + 20
        while group.queued < len(calls) - 1:
            assert time.monotonic() < deadline, f"{group.queued} queued"
            time.sleep(0.001)

    faults.arm(f"{unit}.after_begin", wait_for_followers, nth=1)

    def call(index: int) -> None:
        try:
            answers[index] = calls[index]()
        except Exception as error:  # each thread's own answer, errors included
            answers[index] = error

    first = threading.Thread(target=call, args=(0,))
    first.start()
    deadline = time.monotonic() + 20
    while group.batches < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    rest = [threading.Thread(target=call, args=(i,)) for i in range(1, len(calls))]
    for thread in rest:
        thread.start()
    for thread in (first, *rest):
        thread.join(30)
        assert not thread.is_alive()
    return answers


def test_renewals_that_arrive_together_share_one_commit_each_answered(rt):
    leases = _running_leases(rt)
    assert rt.complete(leases[1], "succeeded") == "succeeded"  # its lease is gone
    before = rt._worker_writes.batches
    calls = [lambda lease=lease: rt.renew(lease) for lease in leases]
    answers = _together(rt, "renew", calls)
    assert rt._worker_writes.batches - before == 2  # the first alone, the other three in one
    assert isinstance(answers[1], FenceError)
    for lease, answer in zip([leases[0], *leases[2:]], [answers[0], *answers[2:]], strict=True):
        assert answer.attempt_id == lease.attempt_id and answer.version == lease.version + 1
    assert rt.verify_projections().ok


def test_start_barriers_that_arrive_together_share_one_commit(rt):
    rt.publish(manifest())
    run_id = rt.start("wide", "w", admission_key="k").run_id
    leases = rt.lease_attempts("w1", limit=WIDTH, ttl_ms=60_000)
    before = rt._worker_writes.batches
    answers = _together(
        rt, "running", [lambda lease=lease: rt.mark_running(lease) for lease in leases]
    )
    assert rt._worker_writes.batches - before == 2
    assert [a.attempt_id for a in answers] == [lease.attempt_id for lease in leases]
    run = rt.get_run(run_id)
    assert all(step.status == "running" for step in run.steps.values())
    for lease in answers:
        assert rt.complete(lease, "succeeded") == "succeeded"
    assert rt.get_run(run_id).status == "succeeded"


def test_a_renewal_alone_is_written_at_once_in_its_own_commit(rt):
    leases = _running_leases(rt)
    before = rt._worker_writes.batches
    for lease in leases:
        rt.renew(lease)
    assert rt._worker_writes.batches - before == WIDTH


# --- cancels (docs/DESIGN.md "Group commit") -----------------------------------------------


def _pending_runs(rt, count: int) -> list[str]:
    rt.publish(manifest())
    return [rt.start("wide", "w", admission_key=f"c{n}").run_id for n in range(count)]


def test_cancels_that_arrive_together_share_one_commit_each_answered(rt):
    """The first cancel alone, the others in one commit: a Run that does not exist is
    refused alone, a Run asked twice records its intent once (with the first reason
    of the batch), the rest are cancelled."""
    runs = _pending_runs(rt, 3)
    before = rt._cancels.batches
    calls = [
        (runs[0], "user"),
        (runs[1], "policy"),
        ("run:nope", "user"),
        (runs[2], "shutdown"),
        (runs[1], "user"),
    ]
    answers = _together(
        rt,
        "cancel",
        [lambda r=r, why=why: rt.cancel(r, why) for r, why in calls],
        rt._cancels,
    )
    assert rt._cancels.batches - before == 2  # the first alone, the other four in one
    assert answers[0] is True and answers[3] is True
    assert isinstance(answers[2], NotFound)
    assert sorted([answers[1], answers[4]]) == [False, True]  # one of the two recorded it
    for run_id in runs:
        assert rt.get_run(run_id).status == "cancelled"
    reasons = {
        run_id: [
            e.data["reason"] for e in rt.events(run_id) if e.type == "workflow.cancel_requested"
        ]
        for run_id in runs
    }
    assert reasons[runs[0]] == ["user"] and reasons[runs[2]] == ["shutdown"]
    assert len(reasons[runs[1]]) == 1
    assert rt.verify_projections().ok


def test_a_cancel_alone_is_written_at_once_in_its_own_commit_and_a_bad_reason_writes_nothing(rt):
    runs = _pending_runs(rt, 2)
    before = rt._cancels.batches
    with pytest.raises(InvalidInput, match="cancel reason"):
        rt.cancel(runs[0], "because")
    with pytest.raises(NotFound):
        rt.cancel("run:nope")
    assert rt._cancels.batches - before == 1  # the bad reason never reached a commit
    assert [rt.cancel(r) for r in runs] == [True, True]
    assert rt.cancel(runs[0]) is False  # its intent is there already
    assert rt._cancels.batches - before == 4
    assert all(rt.get_run(r).status == "cancelled" for r in runs)
