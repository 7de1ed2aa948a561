"""Lost COMMIT responses: the COMMIT reaches the store, the caller never hears back,
and the retry recomputes the same records and replays exactly (SPEC §2, §4, §7).

Two ways to lose the answer:
- `connection` (PostgreSQL): a proxy passes the COMMIT to the server and cuts the
  connection at the server's "COMMIT" reply (tests/faults/commit_cutter.py), armed
  at the unit's `before_commit` point so the cut hits exactly that transaction;
- `simulated` (both stores): the unit's `after_commit` point raises.

A short script (publish, start, cycles, worker writes, a cancel intent while a step
runs, whose worker then vanishes) is played once with the answer of one write lost
— admission, completion, cancel intent, or the cycle's cancellation phase — and the
caller retrying as a careful caller would. Its final log must equal, stream by
stream, the log of the same script played without any loss: same event ids,
versions and content, and the retry itself writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

import qlflow
from eventstore import faults
from tests.cycle.helpers import T0, manifest
from tests.faults.commit_cutter import CommitCutter

CHAIN = [("x", []), ("y", ["x"]), ("w", ["y"])]
LOSABLE = {
    "admission": "admission",  # rt.start: the durable admission unit
    "completion": "complete",
    "cancel_intent": "cancel",
    "cancellation": "cancellation",  # the cycle's cancellation phase
}


@dataclass
class Step:
    name: str
    act: Callable[[qlflow.Runtime], object]
    target: str | None = None  # which LOSABLE write this step is


Y_TTL_MS = 30_000  # every lease's; y's expires with its worker gone


def lease_of(rt, step_key: str, now_ms: int):
    [lease] = rt.lease_attempts("w1", limit=1, ttl_ms=Y_TTL_MS, now_ms=now_ms, step_key=step_key)
    return lease


def script() -> list[Step]:
    leases: dict[str, qlflow.Lease] = {}

    def lease(key: str, at: int):
        def act(rt):
            leases[key] = lease_of(rt, key, at)

        return act

    def run_id(rt) -> str:
        return rt.inspect_admission(admission_key="k").run_id

    return [
        Step("publish", lambda rt: rt.publish(manifest(CHAIN), now_ms=T0)),
        Step(
            "start",
            lambda rt: rt.start("demo", "flow", admission_key="k", now_ms=T0 + 1),
            "admission",
        ),
        Step("cycle", lambda rt: rt.cycle(now_ms=T0 + 2)),
        Step("lease x", lease("x", T0 + 3)),
        Step("running x", lambda rt: rt.mark_running(leases["x"], now_ms=T0 + 4)),
        Step(
            "complete x",
            lambda rt: rt.complete(leases["x"], "succeeded", now_ms=T0 + 5),
            "completion",
        ),
        Step("cycle", lambda rt: rt.cycle(now_ms=T0 + 6)),
        Step("lease y", lease("y", T0 + 7)),
        Step("running y", lambda rt: rt.mark_running(leases["y"], now_ms=T0 + 8)),
        # the cancel ends w (nobody holds it) with its intent; y waits for its worker
        Step("cancel", lambda rt: rt.cancel(run_id(rt), now_ms=T0 + 9), "cancel_intent"),
        Step("cycle", lambda rt: rt.cycle(now_ms=T0 + 10)),
        # y's worker never reports (its completion would end the Run itself): once its
        # lease expires, recovery records y lost and the cancellation phase ends the Run
        Step("cycle", lambda rt: rt.cycle(now_ms=T0 + 7 + Y_TTL_MS), "cancellation"),
    ]


def play(rt, lose: str | None = None, arm_loss: Callable[[str], None] | None = None) -> dict:
    """Play the script; lose the answer of step `lose`'s write; return what each step said."""
    answers: dict[str, object] = {}
    for step in script():
        if step.target != lose or lose is None:
            answers[step.name] = step.act(rt)
            continue
        assert arm_loss is not None
        before = rt.store.head_position()
        arm_loss(LOSABLE[lose])
        try:
            answers["lost"] = step.act(rt)
        except Exception as error:  # what the caller saw instead of the answer
            answers["lost"] = error
        committed = rt.store.head_position()
        assert committed > before, "the COMMIT itself went through"
        answers["retry"] = step.act(rt)  # the caller retries (a cycle: the next one)
        assert rt.store.head_position() == committed, "the retry wrote nothing"
    return answers


def log_by_stream(rt) -> dict[str, list[tuple]]:
    streams: dict[str, list[tuple]] = {}
    for r in rt.events():
        streams.setdefault(r.stream_id, []).append(
            (r.stream_version, r.event_id, r.type, r.data, r.metadata)
        )
    return streams


@pytest.fixture
def reference(tmp_path) -> dict[str, list[tuple]]:
    """The script without any loss (SQLite: the log's content does not depend on the store)."""
    with qlflow.open(f"sqlite:///{tmp_path / 'reference.db'}", "standalone") as rt:
        play(rt)
        assert rt.get_run(rt.inspect_admission(admission_key="k").run_id).status == "cancelled"
        return log_by_stream(rt)


@pytest.fixture(autouse=True)
def _disarm():
    yield
    faults.disarm()


def check(rt, answers: dict, lose: str, reference: dict) -> None:
    lost, retry = answers["lost"], answers["retry"]
    if lose == "admission":
        # the runtime retries on its own: the retry found the durable receipt
        assert not isinstance(lost, Exception) and lost.status == "existing"
        assert retry.status == "existing" and retry.run_id == lost.run_id
    elif lose == "completion":
        assert isinstance(lost, Exception) or lost == "succeeded"
        assert retry == "succeeded", "the retry answers with the recorded status"
    elif lose == "cancel_intent":
        assert isinstance(lost, Exception) or lost is True
        assert retry is False, "the intent was already recorded: nothing new"
    else:
        assert len(lost.cancellation.errors) == 1, lost.cancellation
        assert retry.cancellation.errors == ()
    ids = [r.event_id for r in rt.events()]
    assert len(ids) == len(set(ids)), "no event twice"
    assert log_by_stream(rt) == reference
    assert rt.verify_projections().ok


@pytest.mark.pg
@pytest.mark.parametrize("lose", sorted(LOSABLE))
def test_a_cut_connection_after_commit_is_replayed_exactly(pg_url, reference, lose) -> None:
    cutter = CommitCutter(pg_url)
    try:
        with qlflow.open(cutter.url, "cluster") as rt:
            answers = play(
                rt, lose, lambda unit: faults.arm(f"{unit}.before_commit", cutter.arm, nth=1)
            )
            assert cutter.cuts == 1 and not cutter.armed, "exactly one answer was lost"
            if lose != "admission":
                assert "connection" in str(answers["lost"]) or "closed" in str(answers["lost"])
            check(rt, answers, lose, reference)
    finally:
        cutter.close()


@pytest.mark.parametrize("lose", sorted(LOSABLE))
def test_a_lost_answer_is_replayed_exactly(store_url, reference, lose) -> None:
    with qlflow.open(store_url) as rt:
        answers = play(rt, lose, lambda unit: faults.arm(f"{unit}.after_commit", "raise"))
        assert faults.counts()[f"{LOSABLE[lose]}.after_commit"] >= 1, "the fault fired"
        check(rt, answers, lose, reference)
