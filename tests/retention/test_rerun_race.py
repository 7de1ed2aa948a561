"""A rerun of a finished Run admitted while retention removes that Run, on both
stores, two runtimes (two connections) in two threads, interleaved by fault points
(docs/DESIGN.md, "Retention"): whichever takes the source's lock first, the rerun
never ends up with its source removed.

- The rerun first (it holds the source's head lock and has appended, not committed):
  retention waits, then asks the domain again under its locks, sees the rerun
  running and keeps the source.
- Retention first (its batch holds the source's lock and has written its record, not
  committed): the rerun waits, then finds the source gone ("pruned by retention")
  and admits nothing.

"Waits" is observed, never slept for: on SQLite the waiting side has reached its
BEGIN IMMEDIATE (the other holds the write lock), on PostgreSQL its session is in a
lock wait (pg_stat_activity, by application_name).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import qlflow
from domain.errors import NotFound
from eventstore import faults
from tests.rerun.support import T0, drive
from tests.retention.support import finished_runs

WAIT_S = 60  # a bound on every wait: a test that hangs fails instead


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    yield
    faults.disarm()


class _Side:
    """One runtime on its own connection, run in a thread, its result or error kept."""

    def __init__(self, store_url: str) -> None:
        self.tag = f"race_{uuid.uuid4().hex[:12]}"
        url = store_url
        if store_url.startswith("postgresql"):
            url = f"{store_url}{'&' if '?' in store_url else '?'}application_name={self.tag}"
        self.url, self.store_url = url, store_url
        self.rt = qlflow.open(url)
        self.result: Any = None
        self.error: BaseException | None = None
        self.began = threading.Event()  # about to BEGIN its unit of work
        self._thread: threading.Thread | None = None

    def start(self, call: Callable[[qlflow.Runtime], Any]) -> None:
        def body() -> None:
            try:
                self.result = call(self.rt)
            except BaseException as exc:  # kept for the test to look at
                self.error = exc

        self._thread = threading.Thread(target=body, daemon=True)
        self._thread.start()

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join(timeout=WAIT_S)
        assert not self._thread.is_alive(), "the side did not finish"

    def wait_blocked(self) -> None:
        """Until this side waits for the other's lock (see the module docstring)."""
        assert self.began.wait(WAIT_S), "the side never began its unit of work"
        if not self.store_url.startswith("postgresql"):
            return  # its BEGIN IMMEDIATE cannot pass the other's open write transaction
        deadline = time.monotonic() + WAIT_S
        with psycopg.connect(self.store_url, autocommit=True) as probe:
            while True:
                [(waiting,)] = probe.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = %s AND wait_event_type = 'Lock'",
                    (self.tag,),
                ).fetchall()
                if waiting:
                    return
                assert self._thread is not None and self._thread.is_alive(), (
                    "the side finished without waiting for the other's lock"
                )
                assert time.monotonic() < deadline, "the side never waited for a lock"
                threading.Event().wait(0.005)  # poll interval of the probe

    def close(self) -> None:
        self.rt.close()


@contextmanager
def _paused(point: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Arm `point` to stop the thread that reaches it until released: (reached, release)."""
    reached, release = threading.Event(), threading.Event()

    def hold() -> None:
        reached.set()
        assert release.wait(WAIT_S), f"{point} was never released"

    faults.arm(point, hold, nth=1)
    try:
        yield reached, release
    finally:
        release.set()


def _began(side: _Side, unit: str) -> None:
    faults.arm(f"{unit}.before_begin", side.began.set)


@pytest.fixture
def source(store_url) -> str:
    with qlflow.open(store_url) as rt:
        (run_id,) = finished_runs(rt, 1, fail=frozenset({"right"}))
        assert rt.get_run(run_id).status == "failed"
    return run_id


def test_a_rerun_that_took_its_source_first_keeps_it_from_retention(store_url, source):
    reruns, retains = _Side(store_url), _Side(store_url)
    try:
        with _paused("rerun.before_commit") as (appended, release):
            reruns.start(lambda rt: rt.rerun(source, admission_key="again", now_ms=T0 + 5000))
            assert appended.wait(WAIT_S)
            _began(retains, "retention")
            retains.start(lambda rt: rt.retain(T0 + 9000, now_ms=T0 + 10_000))
            retains.wait_blocked()
            release.set()
            reruns.join()
            retains.join()
    finally:
        reruns.close()
        retains.close()

    assert reruns.error is None and retains.error is None, (reruns.error, retains.error)
    assert reruns.result.status == "created"
    assert retains.result.run_ids == []  # the source of a running rerun stays
    with qlflow.open(store_url) as rt:
        rerun = reruns.result.run_id
        assert rt.get_run(rerun).rerun_of == source
        assert rt.get_run(source).status == "failed"
        assert rt.verify_projections().ok
        drive(rt, rerun, T0 + 6000)
        assert rt.get_run(rerun).status == "succeeded"
        # once the rerun ended, its source may go
        assert rt.retain(T0 + 5500, now_ms=T0 + 10_000).run_ids == [source]
        assert rt.get_run(rerun).status == "succeeded"
        assert rt.verify_projections().ok


def test_a_rerun_that_comes_while_retention_removes_its_source_finds_it_gone(store_url, source):
    reruns, retains = _Side(store_url), _Side(store_url)
    try:
        with _paused("retention.recorded") as (recorded, release):
            retains.start(lambda rt: rt.retain(T0 + 9000, now_ms=T0 + 10_000))
            assert recorded.wait(WAIT_S)
            _began(reruns, "rerun")
            reruns.start(lambda rt: rt.rerun(source, admission_key="again", now_ms=T0 + 5000))
            reruns.wait_blocked()
            release.set()
            retains.join()
            reruns.join()
    finally:
        reruns.close()
        retains.close()

    assert retains.error is None, retains.error
    assert retains.result.run_ids == [source]
    assert isinstance(reruns.error, NotFound), reruns.error
    assert "pruned by retention" in str(reruns.error)
    with qlflow.open(store_url) as rt:
        assert rt.runs(rerun_of=source) == []  # no Run whose source is gone
        assert rt.inspect_admission(admission_key="again") is None
        assert rt.verify_projections().ok
