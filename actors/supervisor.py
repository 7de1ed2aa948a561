"""The page supervisor and the caller-driven cycle (docs/DESIGN.md "The cycle").

A cycle walks the phases in order — recovery, cancellation, schedule, frontier
(with terminal aggregation), attempt admission — and for each takes up to
`pages_per_phase` bounded pages of candidates from the projection indexes. For
a page of Runs the supervisor reads the page's Runs' streams together (one read,
a few queries: `actors.loading.read_runs`), spawns one Workflow actor per
candidate Run with its streams, collects every decided turn, commits them
together in one transaction (each Run's records checked and appended as its own,
`actors.run_writes`), and stops every actor before it returns. A page of due
schedules is turned one schedule after another (`actors.schedules`), each its own
transaction: a turn is short and admission serializes on the publisher anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pykka

from actors import schedules, slot_queue
from actors.authority import Units
from actors.loading import read_runs
from actors.run_writes import commit_prepared
from actors.workflow import Turn, WorkflowActor, WorkflowOutcome
from domain.phases import PHASES, QUEUE, RUN_PHASES, SCHEDULE
from projections import candidates
from projections import limits as limit_rows
from projections import schedules as schedule_rows

log = logging.getLogger("qlflow.cycle")
# the threads a page's Workflow actors take turns on: a turn is CPU under the GIL (its
# Run's streams are read before), so more threads only add their start and switches
# (docs/DESIGN.md "Pages, the supervisor and Workflow actors")
PAGE_THREADS = 1


@dataclass(frozen=True, slots=True)
class PageResult:
    """Counters of one phase of a cycle (summed over its pages)."""

    scanned: int = 0
    settled_runs: int = 0
    settled_attempts: int = 0
    blocked: int = 0
    conflicts: int = 0
    changed: int = 0
    errors: tuple[str, ...] = ()
    pages: int = 0
    fired: int = 0  # schedule phase: occurrences admitted as Runs; queue phase: Runs dequeued
    skipped: int = 0  # schedule phase: occurrences skipped (late, or refused by the guard)

    def __add__(self, other: PageResult) -> PageResult:
        return PageResult(
            self.scanned + other.scanned,
            self.settled_runs + other.settled_runs,
            self.settled_attempts + other.settled_attempts,
            self.blocked + other.blocked,
            self.conflicts + other.conflicts,
            self.changed + other.changed,
            self.errors + other.errors,
            self.pages + other.pages,
            self.fired + other.fired,
            self.skipped + other.skipped,
        )

    @classmethod
    def of(cls, outcomes: list[WorkflowOutcome]) -> PageResult:
        return cls(
            scanned=len(outcomes),
            settled_runs=sum(o.settled_run for o in outcomes),
            settled_attempts=sum(o.settled_attempts for o in outcomes),
            blocked=sum(o.blocked for o in outcomes),
            conflicts=sum(o.conflict for o in outcomes),
            changed=sum(o.changed for o in outcomes),
            errors=tuple(f"{o.run_id}: {o.error}" for o in outcomes if o.error),
            pages=1,
        )

    @classmethod
    def of_queues(cls, outcomes: list[slot_queue.QueueOutcome]) -> PageResult:
        return cls(
            scanned=len(outcomes),
            blocked=sum(o.blocked for o in outcomes),
            conflicts=sum(o.conflict for o in outcomes),
            changed=sum(o.dequeued for o in outcomes),
            errors=tuple(f"{o.slot}: {o.error}" for o in outcomes if o.error),
            pages=1,
            fired=sum(o.dequeued for o in outcomes),
        )

    @classmethod
    def of_schedules(cls, outcomes: list[schedules.ScheduleOutcome]) -> PageResult:
        return cls(
            scanned=len(outcomes),
            blocked=sum(o.blocked for o in outcomes),
            conflicts=sum(o.conflict for o in outcomes),
            changed=sum(o.changed for o in outcomes),
            errors=tuple(f"{o.schedule_id}: {o.error}" for o in outcomes if o.error),
            pages=1,
            fired=sum(o.fired for o in outcomes),
            skipped=sum(o.skipped for o in outcomes),
        )


@dataclass(frozen=True, slots=True)
class CycleResult:
    """One cycle: a PageResult per phase."""

    recovery: PageResult = field(default_factory=PageResult)
    cancellation: PageResult = field(default_factory=PageResult)
    schedule: PageResult = field(default_factory=PageResult)
    queue: PageResult = field(default_factory=PageResult)  # queued Runs that took a slot
    frontier: PageResult = field(default_factory=PageResult)
    claim: PageResult = field(default_factory=PageResult)  # Attempts claimed for ready steps

    @property
    def changed(self) -> int:
        """Runs and schedules that got new records in this cycle (0: the cycle was idle)."""
        return sum(getattr(self, phase).changed for phase in PHASES)


def decide_page(authority: Units, run_ids: list[str], phase: str, now_ms: int) -> list[Turn]:
    """The page's turns, undecided ones as their errors: the page's Runs are read
    together, an actor per Run decides its turn, every actor is stopped."""
    cache = authority.aggregates
    try:
        streams = authority.read(lambda tx: read_runs(tx, run_ids, cache))
    except Exception as error:
        failed = f"the page's read failed: {type(error).__name__}: {error}"
        return [Turn(WorkflowOutcome(run_id, error=failed)) for run_id in run_ids]
    actors = []
    threads = ThreadPoolExecutor(PAGE_THREADS, thread_name_prefix=f"page-{phase}")
    try:
        try:
            for run_id in run_ids:
                actors.append(
                    WorkflowActor.start(run_id, streams.get(run_id), phase, now_ms, threads)
                )
            asked = [actor.ask("turn", block=False) for actor in actors]
        finally:
            # each actor is told to stop right behind its turn: its loop answers, ends
            # and frees its thread for the next actor (a page's actors share its
            # threads, so none may wait for another's stop); if a start failed, the
            # actors that did start end too (a live loop would keep its thread)
            stopped = [actor.stop(block=False) for actor in actors]
        turns: list[Turn] = list(pykka.get_all(asked))
        pykka.get_all(stopped)
    finally:
        threads.shutdown(wait=True)
    return turns


def commit_page(authority: Units, turns: list[Turn], phase: str) -> list[WorkflowOutcome]:
    """Write the page's decided turns in one transaction (unit `phase`); each turn's
    outcome, blocked or in conflict where its Run's locks or streams said so."""
    prepared = [turn.prepared for turn in turns if turn.prepared is not None]
    if not prepared:
        return [turn.outcome for turn in turns]
    try:
        fates, after = authority.execute(lambda tx: commit_prepared(tx, prepared), name=phase)
    except Exception as error:
        failed = f"the page's write failed: {type(error).__name__}: {error}"
        return [
            turn.outcome
            if turn.prepared is None
            else WorkflowOutcome(turn.outcome.run_id, error=failed)
            for turn in turns
        ]
    authority.aggregates.put(after.values())
    fate_of = iter(fates)
    outcomes = []
    for turn in turns:
        fate = "written" if turn.prepared is None else next(fate_of)
        run_id = turn.outcome.run_id
        if fate == "blocked":
            outcomes.append(WorkflowOutcome(run_id, blocked=True))
        elif fate == "conflict":
            outcomes.append(WorkflowOutcome(run_id, conflict=True))
        else:
            outcomes.append(turn.outcome)
    return outcomes


class Cycle:
    """Runs cycles for one runtime. Remembers, per phase, where the last page
    ended, so a long candidate list is walked fairly across cycles."""

    def __init__(
        self,
        authority: Units,
        page_size: int,
        pages_per_phase: int,
        schedule_page_size: int = 16,
        schedule_grace_ms: int = 300_000,
    ) -> None:
        self._authority = authority
        self._page_size = page_size
        self._pages_per_phase = pages_per_phase
        self._schedule_page_size = schedule_page_size
        self._schedule_grace_ms = schedule_grace_ms
        self._cursor: dict[str, candidates.Cursor | None] = dict.fromkeys(RUN_PHASES)
        self._queue_cursor: str | None = None
        # called with (phase, seconds) after each phase (metrics; docs/DESIGN.md,
        # "Observability")
        self.on_phase: Callable[[str, float], None] | None = None

    def run(self, now_ms: int) -> CycleResult:
        began = time.perf_counter()
        if self._idle(now_ms):
            return self._idle_result(time.perf_counter() - began)
        results = {}
        for phase in PHASES:
            began = time.perf_counter()
            if phase == SCHEDULE:
                results[phase] = self._schedules(now_ms)
            elif phase == QUEUE:
                results[phase] = self._queues(now_ms)
            else:
                results[phase] = self._phase(phase, now_ms)
            if self.on_phase is not None:
                self.on_phase(phase, time.perf_counter() - began)
        result = CycleResult(**results)
        for phase in PHASES:
            phase_result = results[phase]
            if phase_result.scanned:
                log.info(
                    "cycle %s: scanned=%d changed=%d settled_runs=%d settled_attempts=%d "
                    "blocked=%d conflicts=%d",
                    phase,
                    phase_result.scanned,
                    phase_result.changed,
                    phase_result.settled_runs,
                    phase_result.settled_attempts,
                    phase_result.blocked,
                    phase_result.conflicts,
                )
            for error in phase_result.errors:
                log.error("cycle %s: %s", phase, error)
        return result

    def _idle(self, now_ms: int) -> bool:
        """No phase has work at `now_ms`: the first candidate of every phase, asked for
        in one read (one round trip on PostgreSQL). A cycle with work runs its phases
        in turn, each reading its own pages (an earlier phase's writes may open work
        for a later one); with none, none of them would do anything."""
        probes = [candidates.work_probe(phase, now_ms) for phase in RUN_PHASES]
        probes += [schedule_rows.due_probe(now_ms), limit_rows.queued_probe()]
        return not any(self._authority.store.query_all(probes, prepared=True))

    def _idle_result(self, seconds: float) -> CycleResult:
        """What every phase of an idle cycle finds: nothing (their cursors start over)."""
        self._cursor = dict.fromkeys(RUN_PHASES)
        self._queue_cursor = None
        if self.on_phase is not None:
            for phase in PHASES:  # the one read, shared by the phases it asked for
                self.on_phase(phase, seconds / len(PHASES))
        return CycleResult(**{phase: PageResult() for phase in PHASES})

    def _schedules(self, now_ms: int) -> PageResult:
        """Up to `pages_per_phase` pages of due schedules, keyset-paged in this cycle by
        (work_at_ms, id), so a schedule that could not be turned (blocked, in conflict)
        does not hide the ones after it."""
        total = PageResult()
        after: tuple[int, str] | None = None
        for _ in range(self._pages_per_phase):
            page = schedules.due_page(self._authority, now_ms, self._schedule_page_size, after)
            if not page:
                break
            outcomes = [
                schedules.run_turn(self._authority, sid, now_ms, self._schedule_grace_ms)
                for _, sid in page
            ]
            total += PageResult.of_schedules(outcomes)
            if len(page) < self._schedule_page_size:
                break
            after = page[-1]
        return total

    def _queues(self, now_ms: int) -> PageResult:
        """Up to `pages_per_phase` pages of slots with a queue, one turn each, resumed
        after the slot where the last cycle stopped (and wrapped around)."""
        total = PageResult()
        size = self._schedule_page_size
        seen: set[str] = set()
        for _ in range(self._pages_per_phase):
            after = self._queue_cursor
            page = slot_queue.slot_page(self._authority, size, after)
            if len(page) < size and after is not None:
                page += slot_queue.slot_page(self._authority, size - len(page), None)
            page = [slot for slot in dict.fromkeys(page) if slot not in seen]
            if not page:
                self._queue_cursor = None
                break
            seen.update(page)
            outcomes = [slot_queue.run_turn(self._authority, slot, now_ms) for slot in page]
            total += PageResult.of_queues(outcomes)
            self._queue_cursor = page[-1] if len(page) == size else None
        return total

    def _phase(self, phase: str, now_ms: int) -> PageResult:
        """Up to `pages_per_phase` pages of the phase's candidates. A full page (more
        may follow) commits on the phase's commit thread while the next page is read
        and decided: their Runs differ, and each commit checks the versions its turns
        read (docs/DESIGN.md "Pages, the supervisor and Workflow actors"); one commit
        at a time, every one done when the phase ends. A short page, the phase's last,
        commits on the caller's thread (a phase of one page starts no commit thread)."""
        total = PageResult()
        seen: set[str] = set()
        store = self._authority.store
        writing: Future[list[WorkflowOutcome]] | None = None
        committer: ThreadPoolExecutor | None = None
        try:
            for _ in range(self._pages_per_phase):
                after = self._cursor[phase]
                found = candidates.work_page(store, phase, now_ms, self._page_size, after)
                if len(found) < self._page_size and after is not None:
                    # wrap around: the start of the list comes after its end
                    found += candidates.work_page(
                        store, phase, now_ms, self._page_size - len(found)
                    )
                run_ids = [r for r in dict.fromkeys(r for _, r in found) if r not in seen]
                if not run_ids:
                    self._cursor[phase] = None
                    break
                seen.update(run_ids)
                turns = decide_page(self._authority, run_ids, phase, now_ms)
                if writing is not None:
                    total += PageResult.of(writing.result())
                    writing = None
                full = len(found) == self._page_size
                self._cursor[phase] = found[-1] if full else None
                if not full:
                    total += PageResult.of(commit_page(self._authority, turns, phase))
                    continue
                if committer is None:
                    committer = ThreadPoolExecutor(1, thread_name_prefix=f"commit-{phase}")
                writing = committer.submit(commit_page, self._authority, turns, phase)
            if writing is not None:
                total += PageResult.of(writing.result())
        finally:
            if committer is not None:
                committer.shutdown(wait=True)
        return total
