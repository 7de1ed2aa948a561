"""A cycle's pages: a page's Workflow actors take turns on the page's thread, and a
phase's pages overlap (docs/DESIGN.md "Pages, the supervisor and Workflow actors")."""

from __future__ import annotations

import threading

import qlflow
from actors import supervisor
from tests.cycle.helpers import T0, chain
from tests.cycle.test_end_to_end import start


def test_a_pages_actors_take_turns_on_its_threads(store_url, monkeypatch):
    # one actor per Run, but not a thread per actor: a page's actors share
    # PAGE_THREADS threads, and every thread has ended when the cycle returns
    with qlflow.open(store_url) as rt:
        runs = [start(rt, chain(2), timeout_ms=1_000, key=f"k{n}") for n in range(30)]
        started: list[threading.Thread] = []
        thread_start = threading.Thread.start

        def counted(thread: threading.Thread) -> None:
            started.append(thread)
            thread_start(thread)

        monkeypatch.setattr(threading.Thread, "start", counted)
        result = rt.cycle(now_ms=T0 + 1_000)  # every Run past its deadline: one page of 30
        monkeypatch.undo()
        assert result.cancellation.settled_runs == 30
        assert {rt.get_run(run_id).status for run_id in runs} == {"timed_out"}
        # the page's thread(s) only: a phase of one page (short: the phase's last)
        # commits it on the caller's thread
        assert all(thread.name.startswith("page-cancellation") for thread in started)
        assert 1 <= len(started) <= supervisor.PAGE_THREADS
        assert not any(thread.is_alive() for thread in started)


def test_a_phase_of_many_pages_counts_every_page(store_url):
    # a page commits while the next is decided: every page's Runs are written and
    # counted, the last one too, and the cursor resumes where the fourth page ended
    with qlflow.open(store_url, page_size=4) as small:
        runs = [start(small, chain(2), timeout_ms=1_000, key=f"k{n}") for n in range(20)]
        baseline = threading.active_count()
        first = small.cycle(now_ms=T0 + 1_000)
        assert threading.active_count() <= baseline  # the commit thread ended too
        assert first.cancellation.scanned == 16  # four pages of four
        assert first.cancellation.settled_runs == 16
        second = small.cycle(now_ms=T0 + 1_000)
        assert second.cancellation.settled_runs == 4
        assert {small.get_run(run_id).status for run_id in runs} == {"timed_out"}
        assert small.cycle(now_ms=T0 + 1_000).changed == 0
