"""A model-based test over the public API, on both stores (docs/DESIGN.md, "Tests that
cannot pass by accident").

A hypothesis state machine drives `qlflow.open(url)` the way hosts do: starts with
parameters, retry policies with backoff and Workflow deadlines, a schedule that fires
Runs as the clock passes its occurrences, cancels, cycles,
leases, completions that succeed or fail, workers that vanish (their leases expire),
and a clock that moves by milliseconds to minutes. After every step it checks:

(a) the candidate index against the domain: at the current instant and at instants
    ahead (each work set's edges, and a random one), a Run is on a phase's index page
    exactly when the domain's decision for that phase writes then (`domain.work`);
(b) no step crossed its start barrier twice behind a host's back;
(c) liveness, at the end: cooperative workers and cycles bring every Run to a
    terminal status within LIVENESS_ROUNDS rounds, each moving the clock to the next
    instant the domain says work opens;
(d) exact replay: repeating an acknowledged start or completion answers the same and
    appends nothing;
(e) flow control (docs/DESIGN.md "Flow control"): Runs start at random priorities,
    some of a Workflow with `max_running = 2` (they queue) whose first step's Task has
    a limit of 1 per `day`: at every step, no slot has more holders at the current
    instant than its limit (by the domain's own rules over every Run's aggregate), and
    a queued Run is on no phase's page (it is no work until it takes its slot);
(f) step timeouts: every step has its Task's 5 s timeout, `left` its own 2 s; some
    workers hang and keep renewing,
    and complete `timed_out` when a renewal says the step passed it: every Attempt
    recorded `step_timeout` ended at or after its deadline, and counts as a retry;
(g) reruns of finished Runs (some from a step) reuse what succeeded and run the rest,
    under the same invariants and the same liveness;
(h) retention removes Runs that finished before a past instant (never the source of
    a running rerun): the removed Runs leave the lists, an acknowledged start of one
    still answers `existing` with its id and writes nothing, and at the end `verify`
    finds the remaining log and the read models exact (every gap named);
(i) lost answers on the run path: a pool's worker whose lease call (with a request
    id) or completion-with-next-work committed while its answer was lost sends it
    again: the retry writes nothing and hands live, started leases of its own, which
    it runs — under (b) and (c), nothing is run twice and nothing is stranded.

CI runs EXAMPLES state machines of up to 30 steps per store; QLFLOW_FUZZ_EXAMPLES=N
scales that (tests/hypothesis_budget.py).
"""

from __future__ import annotations

import os
import tempfile
import uuid

import psycopg
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import qlflow
from domain.errors import FenceError
from domain.phases import RUN_PHASES
from domain.slots import HELD, attempt_slot, holds_until, run_slot_state
from domain.transitions import STEP_TIMEOUT
from domain.work import phase_work
from eventstore import faults
from eventstore.url import with_search_path
from projections import candidates
from qlflow.errors import InvalidInput, NotFound
from qlflow.testing import next_due
from tests.domain.test_decisions_properties import assert_never_started_twice_behind_your_back
from tests.hypothesis_budget import examples

EXAMPLES = 30
LIVENESS_ROUNDS = 60
T0 = 1_800_000_000_000
TTL_MS = 5_000
MOVES_MS = (1, 999, 1_000, 5_000, 30_000, 120_000)
PAGE = 10_000
TASK_TIMEOUT_MS = 5_000  # every step's, from its Task
LEFT_TIMEOUT_MS = 2_000  # step left's own
HANG_TTL_MS = 60_000  # a hanging step's host renews with this TTL


def manifest() -> dict:
    """fetch -> (left, right) -> join, every step retried with backoff, and a Workflow
    with a deadline that the clock may reach."""
    steps = [
        {"key": "fetch", "task": "t", "retry": {"max_attempts": 2, "backoff_ms": 1_000}},
        {"key": "left", "task": "t", "needs": ["fetch"], "timeout_ms": LEFT_TIMEOUT_MS,
         "retry": {"max_attempts": 3, "backoff_ms": 5_000}},
        {"key": "right", "task": "t", "needs": ["fetch"]},
        {"key": "join", "task": "t", "needs": ["left", "right"],
         "retry": {"max_attempts": 2, "backoff_ms": 30_000}},
    ]  # fmt: skip
    params = {"day": {"type": "string", "default": "mon"}, "n": {"type": "integer", "default": 1}}
    limited = [{**steps[0], "task": "per_day"}, *steps[1:]]
    return {
        "package": {"name": "model", "publisher": "acme"},
        "tasks": {
            "t": {"command": ["true"], "timeout_ms": TASK_TIMEOUT_MS},
            "per_day": {
                "command": ["true"],
                "timeout_ms": TASK_TIMEOUT_MS,
                "concurrency": {"limit": 1, "key": "{params.day}"},
            },
        },
        "workflows": {
            "open": {"params": params, "steps": steps},
            "limited": {"params": params, "steps": limited, "max_running": 2},
            "bounded": {"params": params, "steps": steps, "timeout_ms": 60_000},
            "timed": {  # the schedule fires a Run every 2 minutes of the model's clock
                "params": params,
                "steps": steps[:2],
                "schedules": [{"cron": "*/2 * * * *", "timezone": "UTC"}],
            },
        },
    }


class RuntimeModel(RuleBasedStateMachine):
    """The public API as hosts drive it; `url_factory` gives a fresh store per example."""

    url_factory: staticmethod  # set per store below

    def __init__(self) -> None:
        super().__init__()
        self.url, self._drop = self.url_factory()
        self.rt = qlflow.open(self.url)
        self.now = T0
        self.rt.publish(manifest(), now_ms=self.now)
        self.runs: dict[str, str] = {}  # admission key -> run id
        self.acknowledged: list[tuple] = []  # what replays must answer the same
        self.hanging: list = []  # leases of workers whose step hangs; they keep renewing
        self.next_up: list = []  # started leases a completion took as its worker's next work
        self.removed: set[str] = set()  # Runs retention removed

    def teardown(self) -> None:
        try:
            self._check_liveness()
            if self.removed:  # (h) what is left of the log still proves the read models
                assert self.rt.verify_projections().ok
        finally:
            self.rt.close()
            self._drop()

    def _events(self) -> int:
        return self.rt.store.head_position()

    def _all_runs(self) -> list[str]:
        """The Runs started here and those the schedule fired."""
        return [run.run_id for run in self.rt.runs(limit=PAGE)]

    # -- rules ------------------------------------------------------------------------

    @initialize()
    def first_start(self) -> None:
        self._start("open", "mon")

    @rule(
        workflow=st.sampled_from(["open", "bounded", "limited"]),
        day=st.sampled_from(["mon", "tue"]),
        priority=st.sampled_from([None, -1, 0, 5]),
    )
    def start(self, workflow: str, day: str, priority: int | None) -> None:
        self._start(workflow, day, priority)

    def _start(self, workflow: str, day: str, priority: int | None = None) -> None:
        key = f"k{len(self.runs)}"
        receipt = self.rt.start("model", workflow, admission_key=key, params={"day": day},
                                priority=priority, now_ms=self.now)  # fmt: skip
        self.runs[key] = receipt.run_id
        self.acknowledged.append(("start", workflow, key, day, priority, receipt.run_id))

    @rule(ms=st.sampled_from(MOVES_MS))
    def move_clock(self, ms: int) -> None:
        self.now += ms

    @rule()
    def cycle(self) -> None:
        self.rt.cycle(now_ms=self.now)

    @rule(outcome=st.sampled_from(["succeeded", "failed", "vanish", "hang"]))
    def work_one(self, outcome: str) -> None:
        leases = self.rt.lease_attempts("w", ttl_ms=TTL_MS, now_ms=self.now)
        if not leases:
            return
        lease = self.rt.mark_running(leases[0], now_ms=self.now)
        if outcome == "vanish":  # the worker is gone: its lease expires, recovery acts
            return
        if outcome == "hang":  # the step does not end; its host renews (f)
            self.hanging.append(self.rt.renew(lease, ttl_ms=HANG_TTL_MS, now_ms=self.now))
            return
        recorded = self.rt.complete(lease, outcome, now_ms=self.now)
        self.acknowledged.append(("complete", lease, outcome, self.now, recorded))

    @rule(
        outcomes=st.lists(st.sampled_from(["succeeded", "failed"]), min_size=1, max_size=4),
        limit=st.sampled_from([1, 3]),
        lose=st.sampled_from([None, None, "lease", "completion"]),
    )
    def work_next(self, outcomes: list[str], limit: int, lose: str | None) -> None:
        """A pool's worker: it runs what its last completion took as its next work (or
        leases with the start barrier), and each completion takes the next in the same
        commit (`complete_and_lease`). What it took and the clock outran is lost. (i)
        `lose`: the answer of its first lease call or completion is lost after COMMIT,
        and the worker sends the call again."""
        for outcome in outcomes:
            if self.next_up:
                lease = self.next_up.pop(0)
            else:
                request_id = uuid.uuid4().hex
                leases = self._sent_again(
                    "lease_start" if lose == "lease" else None,
                    lambda request_id=request_id: self.rt.lease_attempts(
                        "p", ttl_ms=TTL_MS, now_ms=self.now, start=True, request_id=request_id
                    ),
                )
                lose = None if lose == "lease" else lose
                if not leases:
                    return
                lease = leases[0]
            unit = "complete" if lose == "completion" else None
            lose = None if unit else lose
            try:
                done = self._sent_again(
                    unit,
                    lambda lease=lease, outcome=outcome: self.rt.complete_and_lease(
                        lease, outcome, limit=limit, ttl_ms=TTL_MS, now_ms=self.now
                    ),
                )
            except (FenceError, NotFound):  # its lease ran out, or retention removed its Run
                continue
            if done.next_leases:
                event("a completion took its worker's next work")
            assert all(n.started and n.worker_id == "p" for n in done.next_leases)
            self.acknowledged.append(("complete", lease, outcome, self.now, done.status))
            self.next_up.extend(done.next_leases)

    def _sent_again(self, unit: str | None, call):
        """`call()`; with `unit`, its answer is lost after COMMIT and the call is sent
        again, which must write nothing where that COMMIT wrote something."""
        if unit is None:
            return call()
        faults.arm(f"{unit}.after_commit", "raise")
        written_before = self._events()
        try:
            first = call()  # no unit committed (nothing to lease): nothing was lost
        except faults.InjectedFault:
            first = None
        finally:
            faults.disarm()
        if first is not None:
            return first
        before = self._events()
        answer = call()
        if before == written_before:
            # the unit committed nothing (what it was offered was held, or its slots
            # full): there was no answer to lose, and the call sent again is a new one
            event(f"a lost answer of {unit} that wrote nothing")
        else:
            assert self._events() == before, "the call sent again wrote nothing"
        leases = answer if isinstance(answer, list) else list(answer.next_leases)
        assert all(n.started and n.worker_id == "p" for n in leases)
        event(f"a lost answer of {unit}, sent again")
        return answer

    @precondition(lambda self: self.hanging)
    @rule(at_deadline=st.booleans())
    def renew_hanging(self, at_deadline: bool) -> None:
        """(f) a host renews each hanging step (`at_deadline`: the clock first moves to
        the earliest step deadline, where a host renews at once); past its timeout it
        stops it and records it timed_out, under a cancel it stops it as asked."""
        deadlines = [lease.step_deadline_ms for lease in self.hanging if lease.step_deadline_ms]
        if at_deadline and deadlines:
            self.now = max(self.now, min(deadlines))
        still: list = []
        for lease in self.hanging:
            try:
                lease = self.rt.renew(lease, ttl_ms=HANG_TTL_MS, now_ms=self.now)
            except FenceError:  # its lease ran out first: recovery recorded it lost
                continue
            if lease.step_timed_out:
                assert lease.step_deadline_ms is not None and self.now >= lease.step_deadline_ms
                recorded = self.rt.complete(lease, "timed_out", now_ms=self.now)
                event("a hanging step timed out")
                self.acknowledged.append(("complete", lease, "timed_out", self.now, recorded))
            elif lease.stop_requested:
                self.rt.complete(lease, "failed", now_ms=self.now)
            else:
                still.append(lease)
        self.hanging = still

    @rule(index=st.integers(min_value=0, max_value=20), from_left=st.booleans())
    def rerun(self, index: int, from_left: bool) -> None:
        """(g) a rerun of a finished Run: same plan, from `left` or of what did not
        succeed."""
        finished = [r for r in self._all_runs() if self.rt.get_run(r).terminal]
        if not finished:
            return
        source = finished[index % len(finished)]
        key = f"rerun-{source}-{from_left}"
        if not from_left and self.rt.get_run(source).status == "succeeded":
            before = self._events()
            with pytest.raises(InvalidInput, match="every step"):  # nothing would run again
                self.rt.rerun(source, admission_key=key, now_ms=self.now)
            assert self._events() == before
            return
        receipt = self.rt.rerun(
            source, ["left"] if from_left else None, admission_key=key, now_ms=self.now
        )
        again = self.rt.rerun(
            source, ["left"] if from_left else None, admission_key=key, now_ms=self.now
        )
        assert (again.run_id, again.status) == (receipt.run_id, "existing")
        event("a finished Run was rerun")

    @rule(age_ms=st.sampled_from([1, 60_000, 600_000]), batch=st.sampled_from([1, 2, 100]))
    def retain(self, age_ms: int, batch: int) -> None:
        """(h) remove what finished at least `age_ms` ago, `batch` Runs per batch."""
        before = set(self._all_runs())
        self.rt.retain(self.now - age_ms, batch=batch, now_ms=self.now)
        removed = before - set(self._all_runs())
        for run_id in removed:
            with pytest.raises(NotFound, match="pruned by retention"):
                self.rt.get_run(run_id)
        self.removed |= removed
        if removed:
            event("retention removed Runs")

    @precondition(lambda self: self.runs)
    @rule(index=st.integers(min_value=0, max_value=20))
    def cancel(self, index: int) -> None:
        runs = self._all_runs()
        if not runs:  # retention removed every one
            return
        run_id = runs[index % len(runs)]
        self.rt.cancel(run_id, "user", now_ms=self.now)

    @precondition(lambda self: self.acknowledged)
    @rule(index=st.integers(min_value=0, max_value=50))
    def replay(self, index: int) -> None:
        """(d): an acknowledged call, repeated, answers the same and appends nothing."""
        call = self.acknowledged[index % len(self.acknowledged)]
        before = self._events()
        if call[0] == "start":
            _, workflow, key, day, priority, run_id = call
            again = self.rt.start("model", workflow, admission_key=key, params={"day": day},
                                  priority=priority, now_ms=self.now)  # fmt: skip
            assert (again.run_id, again.status) == (run_id, "existing")
        else:
            _, lease, outcome, at, recorded = call
            if lease.run_id in self.removed:
                return  # its Run is gone: nothing answers for its lease any more
            assert self.rt.complete(lease, outcome, now_ms=at) == recorded
        assert self._events() == before

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def index_matches_the_decisions(self) -> None:
        """(a) at now and ahead: on a phase's page exactly when the decision writes."""
        for run_id in self._all_runs():
            aggregate = self.rt.aggregate_at(run_id)
            work = phase_work(aggregate)
            ahead = {self.now, self.now + 1, self.now + 61_000}
            for work_set in work.values():
                for window in work_set:
                    ahead |= {window.opens_ms, window.opens_ms - 1}
                    if window.closes_ms is not None:
                        ahead |= {window.closes_ms - 1, window.closes_ms}
            for at in sorted(t for t in ahead if t >= self.now):
                for phase in RUN_PHASES:
                    offered = run_id in candidates.page(self.rt.store, phase, at, PAGE)
                    decided = any(w.contains(at) for w in work[phase])
                    if len(list(work[phase])) > 1:  # a hull re-checks: only completeness
                        assert offered or not decided, (run_id, phase, at)
                    else:
                        assert offered == decided, (run_id, phase, at, work[phase])

    @invariant()
    def limits_hold(self) -> None:
        """(e) no slot has more holders now than its limit; a queued Run is no work."""
        held: dict[str, int] = {}
        limits: dict[str, int] = {}
        for run_id in self._all_runs():
            aggregate = self.rt.aggregate_at(run_id)
            flow = aggregate.plan.flow
            if run_slot_state(aggregate) == HELD:
                assert flow.run_slot is not None
                held[flow.run_slot.slot] = held.get(flow.run_slot.slot, 0) + 1
                limits[flow.run_slot.slot] = flow.run_slot.declared
            if aggregate.run.queued:
                for phase in RUN_PHASES:
                    assert not any(w.contains(self.now) for w in phase_work(aggregate)[phase])
            for attempt in aggregate.attempts.values():
                ref = attempt_slot(aggregate, attempt.attempt_id)
                until = holds_until(attempt)
                if ref is not None and until is not None and until > self.now:
                    held[ref.slot] = held.get(ref.slot, 0) + 1
                    limits[ref.slot] = ref.declared
        assert all(count <= limits[slot] for slot, count in held.items()), (held, limits)

    @invariant()
    def never_started_twice(self) -> None:
        """(b) for every step of every Run; (f) a step timeout ends an Attempt only
        past its deadline."""
        for run_id in self._all_runs():
            aggregate = self.rt.aggregate_at(run_id)
            for key in aggregate.steps:
                assert_never_started_twice_behind_your_back(aggregate, key)
            timed_out = [a for a in aggregate.attempts.values() if a.result_code == STEP_TIMEOUT]
            if timed_out:
                view = self.rt.get_run(run_id)
                ended = {
                    a.attempt_id: a.ended_at_ms for s in view.steps.values() for a in s.attempts
                }
                for attempt in timed_out:
                    timeout = LEFT_TIMEOUT_MS if attempt.step_key == "left" else TASK_TIMEOUT_MS
                    assert attempt.started_at_ms is not None
                    assert ended[attempt.attempt_id] >= attempt.started_at_ms + timeout

    # -- (c) ----------------------------------------------------------------------------

    def _check_liveness(self) -> None:
        self.rt.cycle(now_ms=self.now)  # arms the schedule if no cycle has yet
        for view in self.rt.schedules():  # the Runs it fired must end; no new ones
            self.rt.pause_schedule(view.schedule_id, now_ms=self.now)
        self.hanging = []  # their hosts are gone: the leases expire
        self.next_up = []
        for _ in range(LIVENESS_ROUNDS):
            self.rt.cycle(now_ms=self.now)
            for lease in self.rt.lease_attempts("w", limit=20, ttl_ms=TTL_MS, now_ms=self.now):
                lease = self.rt.mark_running(lease, now_ms=self.now)
                self.rt.complete(lease, "succeeded", now_ms=self.now)
            open_runs = [r for r in self._all_runs() if not self.rt.get_run(r).terminal]
            if not open_runs:
                return
            due = [next_due(self.rt, r, self.now) for r in open_runs]
            self.now = min((d for d in due if d is not None), default=self.now + 1_000)
        stuck = {r: self.rt.get_run(r).status for r in self._all_runs()}
        raise AssertionError(f"not every Run ended in {LIVENESS_ROUNDS} rounds: {stuck}")


def _sqlite_factory():
    scratch = tempfile.TemporaryDirectory()
    return f"sqlite:///{scratch.name}/model.db", scratch.cleanup


def _pg_factory():
    server = os.environ["QLFLOW_TEST_PG_URL"]
    schema = f"model_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")

    return with_search_path(server, schema), drop


SETTINGS = settings(max_examples=examples(EXAMPLES), stateful_step_count=30, deadline=None)


class SqliteModel(RuntimeModel):
    url_factory = staticmethod(_sqlite_factory)


class PostgresModel(RuntimeModel):
    url_factory = staticmethod(_pg_factory)


def test_the_runtime_model_on_sqlite():
    SqliteModel.TestCase.settings = SETTINGS
    SqliteModel.TestCase().runTest()


@pytest.mark.pg
def test_the_runtime_model_on_postgresql(pg_server_url):
    PostgresModel.TestCase.settings = SETTINGS
    PostgresModel.TestCase().runTest()
