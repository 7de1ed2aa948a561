"""Python Tasks run by `qlflow.Worker` on a real store (both dialects): outputs passed
on, logs stored, both isolations, the source digest checked before a run, and
cancellation reaching a pool process (ended after the grace) or a thread (asked)."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

import qlflow
from qlflow.python.worker import Worker
from tests.commit_counter import commits_by_unit

DEADLINE_S = 60

STEPS = """
import os, time

def fetch(ctx):
    ctx.log.info("fetching %d rows", ctx.params["n"])
    return {"rows": list(range(ctx.params["n"])), "pid": os.getpid()}

async def load(ctx):
    ctx.log.warning("loading %d rows", len(ctx.needs["fetch"]["rows"]))
    return {"loaded": len(ctx.needs["fetch"]["rows"]), "pid": os.getpid()}

def boom(ctx):
    raise ValueError("bad row 7")

def polite(ctx):
    marker = os.path.join(os.path.dirname(__file__), "..", "started")
    with open(marker, "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    while not ctx.stop_requested():
        time.sleep(0.01)
    return {"stopped": True}

def stubborn(ctx):
    marker = os.path.join(os.path.dirname(__file__), "..", "started")
    with open(marker, "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    time.sleep(3600)
"""


def _package(tmp_path: Path, isolation: str, flows: str) -> Path:
    folder = tmp_path / "etlpy"
    (folder / "etl").mkdir(parents=True)
    (folder / "etl" / "__init__.py").write_text("")
    (folder / "etl" / "steps.py").write_text(textwrap.dedent(STEPS))
    tasks = "".join(
        f'[tasks.{name}]\npython = "etl.steps:{name}"\nfiles = ["etl/steps.py"]\n'
        f'isolation = "{isolation}"\n'
        for name in ("fetch", "load", "boom", "polite", "stubborn")
    )
    (folder / "qlflow.toml").write_text(
        '[package]\nname = "etlpy"\npublisher = "tests"\n' + tasks + textwrap.dedent(flows)
    )
    return folder


FLOWS = """
[workflows.daily]
steps = [{key = "fetch", task = "fetch"}, {key = "load", task = "load", needs = ["fetch"]}]
params = { n = { type = "integer", default = 3 } }

[workflows.bad]
steps = [{key = "boom", task = "boom"}]

[workflows.polite]
steps = [{key = "wait", task = "polite"}]

[workflows.stubborn]
steps = [{key = "wait", task = "stubborn"}]
"""


@pytest.fixture
def rt(store_url: str):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


def _drive(rt, worker: Worker, *run_ids: str):
    deadline = time.monotonic() + DEADLINE_S

    def done() -> bool:
        assert time.monotonic() < deadline, "the Runs did not end in time"
        return all(rt.get_run(run_id).terminal for run_id in run_ids)

    return worker.work(done, cycle=True, interval_s=0.05)


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_python_workflow_runs_to_its_end_with_outputs_passed_on(
    rt, tmp_path: Path, isolation: str
) -> None:
    folder = _package(tmp_path, isolation, FLOWS)
    rt.publish(folder)
    good = rt.start("etlpy", "daily", params={"n": 4})
    bad = rt.start("etlpy", "bad")
    with Worker(rt, [folder], log_dir=tmp_path / "logs", slots=2) as worker:
        _drive(rt, worker, good.run_id, bad.run_id)
    run = rt.get_run(good.run_id)
    assert run.status == "succeeded"
    assert run.steps["fetch"].output["rows"] == [0, 1, 2, 3]
    assert run.steps["load"].output["loaded"] == 4
    pids = {run.steps[key].output["pid"] for key in ("fetch", "load")}
    if isolation == "thread":
        assert pids == {os.getpid()}
    else:
        assert os.getpid() not in pids
    lines = b"".join(c.data for c in rt.logs(good.run_id, "fetch")).decode()
    assert "INFO qlflow.task.fetch: fetching 4 rows" in lines
    failed = rt.get_run(bad.run_id)
    assert failed.status == "failed"
    assert failed.steps["boom"].result_code == "exception"
    (failure,) = rt.why(bad.run_id).failures
    assert failure.result_code == "exception"
    assert failure.last_lines[-2:] == (
        "ValueError: bad row 7",
        "qlflow: etl.steps:boom raised ValueError: bad row 7",
    )


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_completion_brings_the_workers_next_work_without_a_lease_commit(
    rt, tmp_path: Path, isolation: str
) -> None:
    folder = _package(tmp_path, isolation, FLOWS)
    rt.publish(folder)
    runs = [rt.start("etlpy", "daily", params={"n": 2}).run_id for _ in range(3)]
    with (
        commits_by_unit() as units,
        Worker(rt, [folder], log_dir=tmp_path / "logs", slots=2) as worker,
    ):
        _drive(rt, worker, *runs)
    assert {rt.get_run(run_id).status for run_id in runs} == {"succeeded"}
    # the first fill leases two fetches; every other step comes with a completion
    # (two slots: each completion takes its own slot's next work)
    assert units.get("lease_start", 0) == 1, units
    assert units["complete"] <= 6


def test_run_once_runs_what_its_one_lease_took(rt, tmp_path: Path) -> None:
    folder = _package(tmp_path, "thread", FLOWS)
    rt.publish(folder)
    run_id = rt.start("etlpy", "daily").run_id
    with Worker(rt, [folder], log_dir=tmp_path / "logs", slots=2) as worker:
        (report,) = worker.run_once(timeout_s=DEADLINE_S)
    assert (report.step_key, report.recorded_status) == ("fetch", "succeeded")
    steps = rt.get_run(run_id).steps
    assert (steps["fetch"].status, steps["load"].status) == ("succeeded", "ready")


def test_a_module_changed_since_publication_never_runs(rt, tmp_path: Path) -> None:
    folder = _package(tmp_path, "process", FLOWS)
    rt.publish(folder)
    steps = folder / "etl" / "steps.py"
    steps.write_text(steps.read_text().replace("def fetch(ctx):", "def fetch(ctx):\n    1/0"))
    run = rt.start("etlpy", "daily")
    with Worker(rt, [folder], log_dir=tmp_path / "logs") as worker:
        _drive(rt, worker, run.run_id)
    step = rt.get_run(run.run_id).steps["fetch"]
    assert (step.status, step.result_code) == ("failed", "source_changed")


@pytest.mark.parametrize("change", ["rewritten_in_place", "symlink"])
def test_a_worker_that_ran_a_task_notices_its_module_change_before_the_next_run(
    rt, tmp_path: Path, change: str
) -> None:
    """The worker remembers files that passed the digest check; a change after it
    (a rewrite of the same size with its mtime put back, the path swapped for a
    symlink to an edited copy) is checked again and refused."""
    folder = _package(tmp_path, "thread", FLOWS)
    rt.publish(folder)
    first = rt.start("etlpy", "daily")
    with Worker(rt, [folder], log_dir=tmp_path / "logs") as worker:
        _drive(rt, worker, first.run_id)
        assert rt.get_run(first.run_id).status == "succeeded"
        steps = folder / "etl" / "steps.py"
        source, before = steps.read_text(), steps.stat()
        edited = source.replace('"rows": list', '"rowz": list')
        assert len(edited) == len(source)
        if change == "rewritten_in_place":
            steps.write_text(edited)
            os.utime(steps, ns=(before.st_atime_ns, before.st_mtime_ns))
        else:
            (folder / "etl" / "copy.py").write_text(edited)
            steps.unlink()
            steps.symlink_to("copy.py")
        second = rt.start("etlpy", "daily")
        _drive(rt, worker, second.run_id)
    step = rt.get_run(second.run_id).steps["fetch"]
    assert (step.status, step.result_code) == ("failed", "source_changed")


def _started(folder: Path, count: int = 1) -> list[int]:
    deadline = time.monotonic() + DEADLINE_S
    marker = folder / "started"
    while True:
        pids = [int(p) for p in marker.read_text().split()] if marker.exists() else []
        if len(pids) >= count:
            return pids
        assert time.monotonic() < deadline, "the step did not start"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("isolation", "flow"), [("process", "polite"), ("thread", "polite"), ("process", "stubborn")]
)
def test_a_cancel_reaches_the_function(rt, tmp_path: Path, isolation: str, flow: str) -> None:
    """A function that looks at stop_requested() returns; one that does not is ended
    with its pool process after the grace. Either way the Attempt is cancelled."""
    folder = _package(tmp_path, isolation, FLOWS)
    rt.publish(folder)
    run = rt.start("etlpy", flow)
    with Worker(rt, [folder], log_dir=tmp_path / "logs", ttl_ms=5_000, kill_after_s=0.5) as w:
        ran = threading.Thread(target=_drive, args=(rt, w, run.run_id), daemon=True)
        ran.start()
        (pid,) = _started(folder)
        rt.cancel(run.run_id)
        w.executor.renew_now(run.run_id)
        ran.join(DEADLINE_S)
        assert not ran.is_alive()
    view = rt.get_run(run.run_id)
    assert view.status == "cancelled"
    assert view.steps["wait"].attempts[0].status == "cancelled"
    if flow == "stubborn":
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    lines = b"".join(c.data for c in rt.logs(run.run_id, "wait")).decode()
    assert "qlflow: asked to stop (stop_requested)" in lines
    if flow == "stubborn":
        assert "ending its pool process" in lines and "SIGKILL" in lines


def test_a_pool_process_killed_mid_step_fails_the_attempt_once(rt, tmp_path: Path) -> None:
    """SIGKILL of the pool process while the function runs: the Attempt (past its
    start barrier) fails `process_died`; it is never run again."""
    folder = _package(tmp_path, "process", FLOWS)
    rt.publish(folder)
    run = rt.start("etlpy", "stubborn")
    with Worker(rt, [folder], log_dir=tmp_path / "logs") as worker:
        ran = threading.Thread(target=_drive, args=(rt, worker, run.run_id), daemon=True)
        ran.start()
        (pid,) = _started(folder)
        os.kill(pid, signal.SIGKILL)
        ran.join(DEADLINE_S)
        assert not ran.is_alive()
    view = rt.get_run(run.run_id)
    assert view.status == "failed"
    step = view.steps["wait"]
    assert step.result_code == "process_died" and len(step.attempts) == 1
    assert _started(folder) == [pid]  # the function started once


def test_a_host_drain_stops_a_pool_process_like_a_command(rt, tmp_path: Path) -> None:
    """`qlflow serve`'s stop: the drain runs out, the function is asked to stop and
    its pool process ended after the grace; the Attempt is recorded as a command's
    would be: interrupted by its host (`worker_shutdown`), the step ready to run
    again."""
    from qlflow.driver import Driver

    folder = _package(tmp_path, "process", FLOWS)
    rt.publish(folder)
    run = rt.start("etlpy", "stubborn")
    with Worker(rt, [folder], log_dir=tmp_path / "logs", kill_after_s=0.3) as worker:
        driver = Driver(
            rt,
            worker.executor,
            worker_id="drain-test",
            interval_ms=50,
            until_run=run.run_id,
            servable=worker.tasks.task_refs,
            drain_s=0.2,
        )
        drove = threading.Thread(target=driver.run, daemon=True)
        drove.start()
        (pid,) = _started(folder)
        driver.request_stop()
        drove.join(DEADLINE_S)
        assert not drove.is_alive()
    step = rt.get_run(run.run_id).steps["wait"]
    first, *again = step.attempts
    assert (first.status, first.result_code) == ("interrupted", "worker_shutdown")
    assert [a.status for a in again] in ([], ["claimed"])  # the step is to run again
    assert step.status in ("ready", "running")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


HOST = """
import sys, qlflow
rt = qlflow.open(sys.argv[1])
with qlflow.Worker(rt, [sys.argv[2]], log_dir=sys.argv[3], ttl_ms=5_000) as worker:
    worker.work(lambda: False, cycle=True, interval_s=0.05)
"""


def test_a_host_killed_mid_step_takes_its_pool_process_with_it(
    rt, store_url: str, tmp_path: Path
) -> None:
    """SIGKILL of the host while a pool process runs a step: the pool process exits
    too, and once the lease expires recovery records the Attempt lost and the step
    failed (past its barrier: never run again)."""
    import subprocess
    import sys

    from tests.cli.helpers import cli_env

    folder = _package(tmp_path, "process", FLOWS)
    rt.publish(folder)
    run = rt.start("etlpy", "stubborn")
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, store_url, str(folder), str(tmp_path / "logs")],
        env=cli_env(),
    )
    try:
        (pid,) = _started(folder)
        host.kill()
        host.wait(DEADLINE_S)
    finally:
        host.kill()
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the pool process outlived its host"
        time.sleep(0.05)
    expires = rt.get_run(run.run_id).steps["wait"].attempts[0].expires_at_ms
    rt.cycle(now_ms=expires + 1)
    step = rt.get_run(run.run_id).steps["wait"]
    assert [a.status for a in step.attempts] == ["lost"]
    assert (step.status, step.result_code) == ("failed", "lease_expired")
    assert _started(folder) == [pid]


def test_a_worker_that_runs_on_hands_back_its_newest_reports_and_keeps_none(
    rt, tmp_path: Path, monkeypatch
) -> None:
    """A host loop runs for a year: `work` hands back the newest `KEPT_REPORTS` of the
    Attempts it ran (each was logged as it ended), and the pool holds no report once
    the call is over — only the count."""
    import qlflow.python.worker as worker_module

    monkeypatch.setattr(worker_module, "KEPT_REPORTS", 3)
    folder = _package(tmp_path, "thread", FLOWS)
    rt.publish(folder)
    runs = [rt.start("etlpy", "daily").run_id for _ in range(4)]
    with Worker(rt, [folder], log_dir=tmp_path / "logs", slots=2) as worker:
        reports = worker.work(
            lambda: all(rt.get_run(r).status == "succeeded" for r in runs), interval_s=0.05
        )
        assert worker.pool.finished == 8  # two steps of four Runs
        assert worker.pool._collectors == []
    assert len(reports) == 3
    attempts = {
        attempt.attempt_id
        for run_id in runs
        for step in rt.get_run(run_id).steps.values()
        for attempt in step.attempts
    }
    assert {r.attempt_id for r in reports} <= attempts
    assert all(r.recorded_status == "succeeded" for r in reports)


def test_the_host_loop_wakes_where_an_attempt_leaves_a_slot_free(rt, tmp_path: Path) -> None:
    """A completion that takes the next work into its own slot leaves the host's loop
    nothing to do: the loop wakes (and asks `until`) where an Attempt's end leaves a
    slot free, not at every Attempt's end — and at the last one, not an interval later."""
    folder = _package(tmp_path, "thread", FLOWS)
    rt.publish(folder)
    runs = [rt.start("etlpy", "daily").run_id for _ in range(4)]
    asked = []

    def until() -> bool:
        asked.append(time.monotonic())
        return all(rt.get_run(r).status == "succeeded" for r in runs)

    interval_s = 60.0  # only the wakes move the loop on
    with Worker(rt, [folder], log_dir=tmp_path / "logs", slots=2) as worker:
        began = time.monotonic()
        worker.work(until, interval_s=interval_s)
        assert worker.pool.finished == 8  # two steps of four Runs
    assert asked[-1] - began < interval_s, "the last Attempt's end woke the loop"
    # once at the start, once where the last Attempts left their slots free (the
    # rest took the next work into their own): before, up to once per Attempt's end
    assert len(asked) <= 3, f"asked {len(asked)} times for 8 Attempts"


def test_a_lease_whose_answer_was_lost_is_run_by_the_next_fill(rt, tmp_path: Path) -> None:
    """The host's lease (start=True) committed and its answer was lost: the started
    Attempts are this host's and no one else's. Its next fill sends the call again
    and is handed them: each step runs once, and the Runs end long before the lost
    leases would have lapsed."""
    from eventstore import faults

    folder = _package(tmp_path, "thread", FLOWS)
    rt.publish(folder)
    runs = [rt.start("etlpy", "daily").run_id for _ in range(2)]
    deadline = time.monotonic() + 20  # the leases would lapse after 30 s

    def done() -> bool:
        assert time.monotonic() < deadline, "the lost leases were not run"
        return all(rt.get_run(r).status == "succeeded" for r in runs)

    with Worker(rt, [folder], log_dir=tmp_path / "logs", slots=2, ttl_ms=30_000) as worker:
        rt.cycle()
        faults.arm("lease_start.after_commit", "raise")
        try:
            with pytest.raises(faults.InjectedFault):
                worker.pool.fill()
        finally:
            faults.disarm()
        assert worker.pool.busy == 0  # nothing started: the answer never came
        worker.work(done, interval_s=0.05)
    for run_id in runs:
        steps = rt.get_run(run_id).steps
        assert {key: len(step.attempts) for key, step in steps.items()} == {"fetch": 1, "load": 1}
