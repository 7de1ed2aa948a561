"""A lost COMMIT answer of a completion that leased the worker's next work
(`complete_and_lease`): the commit granted and started those Attempts, and the caller
heard nothing. Its retry is answered what the commit granted — the same leases, to
run now — and writes nothing; before, the retry replayed the completion alone, and
the started Attempts were lost once their leases lapsed, in nobody's hands.

The same script is played with and without the loss: the answers and the log
must be the same, stream by stream.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import qlflow
from actors import workers
from eventstore import faults
from tests.cycle.helpers import T0, manifest
from tests.faults.commit_cutter import CommitCutter
from tests.faults.test_response_loss import log_by_stream

TTL_MS = 30_000
FAN = [("x", []), ("y", ["x"]), ("z", ["x"])]  # x's completion readies y and z
DONE_AT = T0 + 5


def _open_runs(rt) -> qlflow.Lease:
    """Two Runs: the fan's, whose x is leased and started, and a one-step Run whose
    step waits, claimed: the completion's next work spans both Runs."""
    rt.publish(manifest(FAN), now_ms=T0)
    rt.publish(manifest([("b", [])], package="other"), now_ms=T0)
    rt.start("demo", "flow", admission_key="fan", now_ms=T0 + 1)
    rt.start("other", "flow", admission_key="one", now_ms=T0 + 1)
    rt.cycle(now_ms=T0 + 2)
    [lease] = rt.lease_attempts(
        "w1", limit=1, ttl_ms=TTL_MS, step_key="x", start=True, now_ms=T0 + 3
    )
    return lease


def _complete_x(rt, lease, now_ms: int = DONE_AT):
    return rt.complete_and_lease(lease, "succeeded", limit=3, ttl_ms=TTL_MS, now_ms=now_ms)


def _finish(rt, leases) -> None:
    for lease in leases:
        rt.complete(lease, "succeeded", now_ms=DONE_AT + 1)
    rt.cycle(now_ms=DONE_AT + 2)
    for key in ("fan", "one"):
        assert rt.get_run(rt.inspect_admission(admission_key=key).run_id).status == "succeeded"


def _key(lease) -> tuple:
    return (lease.lease_id, lease.attempt_id, lease.version, lease.expires_at_ms, lease.started)


@pytest.fixture
def reference(tmp_path) -> tuple[list[tuple], dict]:
    """The next leases and the log without any loss."""
    with qlflow.open(f"sqlite:///{tmp_path / 'reference.db'}", "standalone") as rt:
        done = _complete_x(rt, _open_runs(rt))
        assert done.status == "succeeded" and len(done.next_leases) == 3
        _finish(rt, done.next_leases)
        return [_key(lease) for lease in done.next_leases], log_by_stream(rt)


@pytest.fixture(autouse=True)
def _disarm():
    yield
    faults.disarm()


def _lose_then_retry(rt, arm_loss: Callable[[], None]) -> tuple[object, qlflow.Completed]:
    lease = _open_runs(rt)
    before = rt.store.head_position()
    arm_loss()
    try:
        lost: object = _complete_x(rt, lease)
    except Exception as error:  # what the caller saw instead of the answer
        lost = error
    committed = rt.store.head_position()
    assert committed > before, "the COMMIT itself went through"
    retry = _complete_x(rt, lease)
    assert rt.store.head_position() == committed, "the retry wrote nothing"
    return lost, retry


def _check(rt, retry: qlflow.Completed, reference) -> None:
    next_leases, log = reference
    assert retry.status == "succeeded"
    assert [_key(lease) for lease in retry.next_leases] == next_leases
    _finish(rt, retry.next_leases)  # the leases handed again are the ones that run
    assert log_by_stream(rt) == log
    assert rt.verify_projections().ok


def test_a_lost_answer_hands_the_retry_the_leases_its_commit_granted(store_url, reference):
    with qlflow.open(store_url) as rt:
        lost, retry = _lose_then_retry(rt, lambda: faults.arm("complete.after_commit", "raise"))
        assert isinstance(lost, faults.InjectedFault)
        _check(rt, retry, reference)


@pytest.mark.pg
def test_a_cut_connection_hands_the_retry_the_leases_its_commit_granted(pg_url, reference):
    cutter = CommitCutter(pg_url)
    try:
        with qlflow.open(cutter.url, "cluster") as rt:
            lost, retry = _lose_then_retry(
                rt, lambda: faults.arm("complete.before_commit", cutter.arm, nth=1)
            )
            assert cutter.cuts == 1 and not cutter.armed, "exactly one answer was lost"
            assert "connection" in str(lost) or "closed" in str(lost)
            _check(rt, retry, reference)
    finally:
        cutter.close()


def test_a_lease_that_lapsed_before_the_retry_is_not_handed(store_url):
    """A retry that comes after the granted leases expired hands none of them (they
    are no one's now; recovery records them lost), and leases nothing new for a
    replayed completion: its answer is what its commit did."""
    with qlflow.open(store_url) as rt:
        lease = _open_runs(rt)
        faults.arm("complete.after_commit", "raise")
        with pytest.raises(faults.InjectedFault):
            _complete_x(rt, lease)
        committed = rt.store.head_position()
        late = _complete_x(rt, lease, now_ms=DONE_AT + TTL_MS)
        assert late.status == "succeeded" and late.next_leases == ()
        assert rt.store.head_position() == committed
        # while the same retry in time is handed the three
        assert len(_complete_x(rt, lease, now_ms=DONE_AT + TTL_MS - 1).next_leases) == 3


def test_completions_that_shared_a_grant_are_each_handed_their_own_share(tmp_path, store_url):
    """Two completions of one worker in one commit share one grant, its leases handed
    out in their order (the first its 1, the second its 3). Their answers lost, each
    completion sent again on its own is handed exactly its share."""

    def two_fans(rt) -> list[qlflow.Lease]:
        rt.publish(manifest(FAN), now_ms=T0)
        for key in ("one", "two"):
            rt.start("demo", "flow", admission_key=key, now_ms=T0 + 1)
        rt.cycle(now_ms=T0 + 2)
        return rt.lease_attempts("w1", limit=2, ttl_ms=TTL_MS, start=True, now_ms=T0 + 3)

    def completions(leases) -> list[qlflow.Completion]:
        return [
            qlflow.Completion(lease, "succeeded", next_work=workers.NextWork("w1", TTL_MS, limit))
            for lease, limit in zip(leases, (1, 3), strict=True)
        ]

    with qlflow.open(f"sqlite:///{tmp_path / 'reference.db'}", "standalone") as rt:
        answers = rt.complete_many(completions(two_fans(rt)), now_ms=DONE_AT)
        shares = [[_key(lease) for lease in done.next_leases] for done in answers]
    assert [len(share) for share in shares] == [1, 3]
    with qlflow.open(store_url) as rt:
        leases = two_fans(rt)
        faults.arm("complete.after_commit", "raise")
        with pytest.raises(faults.InjectedFault):
            rt.complete_many(completions(leases), now_ms=DONE_AT)
        committed = rt.store.head_position()
        retried = [
            rt.complete_and_lease(lease, "succeeded", limit=limit, ttl_ms=TTL_MS, now_ms=DONE_AT)
            for lease, limit in zip(leases, (1, 3), strict=True)
        ]
        assert rt.store.head_position() == committed, "the retries wrote nothing"
        assert [[_key(lease) for lease in done.next_leases] for done in retried] == shares
