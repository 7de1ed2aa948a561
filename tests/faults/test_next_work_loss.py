"""A lost COMMIT answer of a write that granted leases — a completion that leased the
worker's next work (`complete_and_lease`), a lease call with a request id: the commit
granted and started those Attempts, and the caller heard nothing. Its retry is
answered what the commit granted — the same leases, to run now — and writes
nothing; before, the started Attempts were lost once their leases lapsed, in
nobody's hands.

The same script is played with and without the loss: the answers and the log
must be the same, stream by stream.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import qlflow
from actors import workers
from domain.errors import InvalidInput
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


def _lease_roots(rt, request_id: str = "call-1"):
    return rt.lease_attempts(
        "w1", limit=3, ttl_ms=TTL_MS, start=True, request_id=request_id, now_ms=T0 + 3
    )


def _two_roots(rt) -> None:
    rt.publish(manifest(FAN), now_ms=T0)
    for key in ("one", "two"):
        rt.start("demo", "flow", admission_key=key, now_ms=T0 + 1)
    rt.cycle(now_ms=T0 + 2)


def _lease_lost_then_sent_again(rt, arm_loss: Callable[[], None], reference_keys) -> None:
    _two_roots(rt)
    arm_loss()
    try:
        lost: object = _lease_roots(rt)
    except Exception as error:  # what the caller saw instead of the answer
        lost = error
    assert isinstance(lost, faults.InjectedFault) or "connection" in str(lost), lost
    committed = rt.store.head_position()
    again = _lease_roots(rt)
    assert rt.store.head_position() == committed, "the call sent again wrote nothing"
    assert [_key(lease) for lease in again] == reference_keys
    assert all(lease.started for lease in again)
    # a new call (a new request id) finds nothing: both roots are this worker's
    assert _lease_roots(rt, "call-2") == []


@pytest.fixture
def leased_roots(tmp_path) -> list[tuple]:
    with qlflow.open(f"sqlite:///{tmp_path / 'reference.db'}", "standalone") as rt:
        _two_roots(rt)
        return [_key(lease) for lease in _lease_roots(rt)]


def test_a_lease_call_sent_again_is_handed_what_its_lost_answer_granted(store_url, leased_roots):
    assert len(leased_roots) == 2
    with qlflow.open(store_url) as rt:
        _lease_lost_then_sent_again(
            rt, lambda: faults.arm("lease_start.after_commit", "raise"), leased_roots
        )


@pytest.mark.pg
def test_a_lease_call_whose_connection_was_cut_at_commit_is_handed_its_grants(pg_url, leased_roots):
    cutter = CommitCutter(pg_url)
    try:
        with qlflow.open(cutter.url, "cluster") as rt:
            _lease_lost_then_sent_again(
                rt,
                lambda: faults.arm("lease_start.before_commit", cutter.arm, nth=1),
                leased_roots,
            )
            assert cutter.cuts == 1
    finally:
        cutter.close()


def test_a_lease_call_that_failed_before_its_commit_leases_when_sent_again(store_url):
    """Nothing was granted (the fault came before COMMIT): the call sent again leases."""
    with qlflow.open(store_url) as rt:
        _two_roots(rt)
        faults.arm("lease_start.before_commit", "raise")
        before = rt.store.head_position()
        with pytest.raises(faults.InjectedFault):
            _lease_roots(rt)
        assert rt.store.head_position() == before
        assert len(_lease_roots(rt)) == 2


@pytest.mark.parametrize("request_id", ["", "x" * 129, 7, "a\x00b"])
def test_a_request_id_that_is_not_1_to_128_characters_of_text_is_refused(store_url, request_id):
    with qlflow.open(store_url) as rt:
        _two_roots(rt)
        before = rt.store.head_position()
        with pytest.raises(InvalidInput, match="request_id"):
            rt.lease_attempts("w1", start=True, request_id=request_id, now_ms=T0 + 3)
        assert rt.store.head_position() == before
        assert len(_lease_roots(rt, "x" * 128)) == 2
