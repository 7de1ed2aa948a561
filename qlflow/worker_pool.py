"""A host's local workers: lease Attempts up to the free slots and run each on a
thread of the pool's own through the local executor. A completion takes the
worker's next work in its own commit (`Runtime.complete_and_lease`): the Attempts it
made ready, up to the slots free once it ends, run at once without a lease commit
(docs/DESIGN.md "The run path: two commits per step")."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from qlflow.executor import AttemptReport
from qlflow.executor.seam import Executor
from qlflow.runtime import Lease, Runtime

HOST = socket.gethostname()[:255] or None  # recorded on the grants (`qlflow workers`)
# how long the servable task refs are trusted: a step that ends must not cost a read
# of every publication before its next work is leased; a new generation waits this long
SERVABLE_TTL_S = 1.0
# the reports a host loop that runs until it is stopped hands back at the end: the
# newest ones (every Attempt is logged as it ends; a year of them does not fit)
KEPT_REPORTS = 10_000
log = logging.getLogger("qlflow.driver")


class _Runners:
    """Daemon threads that each run one leased Attempt at a time, started as the
    Attempts at hand need them and kept: starting a thread per Attempt costs the
    caller a wait for the new thread to be scheduled, on the path to the next
    lease. Daemon, as a thread-isolated function that never returns must not keep
    the host's process alive. A runner counts itself idle after its Attempt's slot
    is freed, so a lease in between may start one more: at most twice the slots.
    """

    def __init__(self, run: Callable[[Lease], None]) -> None:
        self._run = run
        self._queue: queue.SimpleQueue[Lease] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0

    def submit(self, lease: Lease) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                start = False
            else:
                self._started += 1
                start = True
        self._queue.put(lease)
        if start:
            name = f"attempt-runner-{self._started}"
            threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            lease = self._queue.get()
            self._run(lease)
            with self._lock:
                self._idle += 1


class WorkerPool:
    """Leases Attempts for one local executor and runs each on a thread of its own
    pool of runners, at most `slots` at once."""

    def __init__(
        self,
        rt: Runtime,
        executor: Executor,
        *,
        worker_id: str,
        slots: int,
        ttl_ms: int,
        run_id: str | None = None,
        tasks: Iterable[str] | None = None,
        servable: Callable[[], frozenset[str]] | None = None,
        on_slot_free: Callable[[], None] | None = None,
    ) -> None:
        self._rt = rt
        self._servable = servable
        self._served: tuple[float, list[str]] | None = None  # (monotonic s, task refs)
        self.executor = executor
        self.worker_id = worker_id
        self.slots = slots
        self.ttl_ms = ttl_ms
        self.run_id = run_id
        self.tasks = list(tasks) if tasks is not None else None
        # the host's loop is woken where an Attempt's end leaves a slot to fill (or
        # nothing running), not where its completion took the next work into it
        self._on_slot_free = on_slot_free
        self._threads: dict[str, Lease] = {}  # the Attempts running, by id
        self._taking = 0  # free slots completions in flight fill with their next work
        self._runners = _Runners(self._execute)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # the reports go to whoever collects them (`collecting`), never kept here: a
        # host that runs for a year ends millions of Attempts
        self.finished = 0  # Attempts that ended with a report, so far
        self._collectors: list[deque[AttemptReport]] = []
        # False: completions take no next work (a host that stops, or leases once)
        self.next_work = True
        self._unanswered: str | None = None  # the request id of a lease call that failed
        executor.completer = self._complete

    @property
    def busy(self) -> int:
        """How many Attempts run right now."""
        with self._lock:
            return len(self._threads)

    def _tasks(self) -> list[str] | None:
        """The task refs this pool leases (None: any); empty: none right now."""
        if self._servable is None:
            return self.tasks
        now = time.monotonic()
        cached = self._served
        if cached is None or now - cached[0] >= SERVABLE_TTL_S:
            servable = self._servable()
            tasks = self.tasks
            cached = (now, sorted(servable if tasks is None else servable.intersection(tasks)))
            self._served = cached
        return cached[1]

    def forget_servable(self) -> None:
        """Read the servable task refs again before the next lease (a package was added)."""
        self._served = None

    def fill(self) -> int:
        """Lease up to the free slots and start each Attempt; returns how many."""
        with self._lock:
            free = self.slots - len(self._threads) - self._taking
        if free <= 0:
            return 0
        tasks = self._tasks()
        if tasks == []:
            return 0
        # a call whose answer was lost is sent again with its request id: it is handed
        # what that call granted (started, in nobody's hands otherwise)
        request_id = self._unanswered or uuid.uuid4().hex
        self._unanswered = request_id
        leases = self._rt.lease_attempts(  # the executor spawns at once: start with the grant
            self.worker_id,
            limit=free,
            ttl_ms=self.ttl_ms,
            run_id=self.run_id,
            tasks=tasks,
            start=True,
            slots=self.slots,
            host=HOST,
            request_id=request_id,
        )
        self._unanswered = None
        self._start(leases)
        return len(leases)

    def _start(self, leases: Iterable[Lease]) -> None:
        for lease in leases:
            with self._lock:
                if lease.attempt_id in self._threads:
                    continue  # handed again by a replay: it runs already
                self._threads[lease.attempt_id] = lease
            self._runners.submit(lease)

    def _complete(
        self,
        lease: Lease,
        outcome: str,
        *,
        result_code: str | None,
        output: Mapping[str, Any] | None,
        execution: Mapping[str, Any] | None,
    ) -> str:
        """The executors' completer: the completion takes up to the slots free once
        this Attempt ends (its own and any other no one has taken) of the Attempts it
        makes ready, and they start at once."""
        with self._lock:
            # its own slot (it still counts among the running), and the free ones no
            # other completion in flight has taken
            extra = max(0, self.slots - len(self._threads) - self._taking)
            take = 1 + extra if self.next_work else 0
            if take:
                self._taking += extra
        try:
            tasks = self._tasks() if take else None
            if not take or tasks == []:
                return self._rt.complete(
                    lease, outcome, result_code=result_code, output=output, execution=execution
                )
            done = self._rt.complete_and_lease(
                lease,
                outcome,
                result_code=result_code,
                output=output,
                execution=execution,
                limit=take,
                ttl_ms=self.ttl_ms,
                tasks=tasks,
                slots=self.slots,
                host=HOST,
                run_id=self.run_id,
            )
            self._start(done.next_leases)
        finally:
            if take:
                with self._lock:
                    self._taking -= extra
        assert done.status is not None
        return done.status

    @contextmanager
    def collecting(self, limit: int | None = None) -> Iterator[deque[AttemptReport]]:
        """The reports of the Attempts that end while inside, in the order they end
        (the newest `limit` of them; None: all)."""
        reports: deque[AttemptReport] = deque(maxlen=limit)
        with self._lock:
            self._collectors.append(reports)
        try:
            yield reports
        finally:
            with self._lock:
                self._collectors = [c for c in self._collectors if c is not reports]

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until no Attempt is running (at most `timeout_s`); True if idle."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._idle:
            while self._threads:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def _execute(self, lease: Lease) -> None:
        report = None
        try:
            report = self.executor.execute(lease)
        except Exception as error:
            # The lease expires and recovery records the loss; this host goes on.
            log.error(
                "attempt %s: the executor failed: %s: %s",
                lease.attempt_id,
                type(error).__name__,
                error,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        finally:
            with self._idle:
                self._threads.pop(lease.attempt_id, None)
                slot_free = len(self._threads) < self.slots
                if report is not None:
                    self.finished += 1
                    for collector in self._collectors:
                        collector.append(report)
                self._idle.notify_all()
            if slot_free and self._on_slot_free is not None:
                self._on_slot_free()
