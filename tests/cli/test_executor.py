"""The local_process executor and the host loop, in process, on a real SQLite runtime:
environment, logs, exit codes, start failures, stop and kill, and no process left."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import qlflow
from qlflow.driver import Driver
from qlflow.executor import TASK_FILE_REFUSED, LocalProcessExecutor, PublishedTasks
from qlflow.packages import MAX_TASK_FILE_BYTES
from tests.cli.helpers import process_alive, read_pid, wait_for, write_package

DRIVE_DEADLINE_S = 30


def _package(tmp_path: Path, tasks: str, steps: str, files: dict[str, str] | None = None):
    toml = f"""
[package]
name = "probe"
publisher = "tests"
{tasks}
[workflows.flow]
steps = {steps}
"""
    return write_package(tmp_path / "probe", toml, files)


@pytest.fixture
def rt(tmp_path: Path):
    runtime = qlflow.open(f"sqlite:///{tmp_path / 'q.db'}")
    yield runtime
    runtime.close()


def drive(
    rt,
    folder: Path,
    tmp_path: Path,
    *,
    folders=None,
    kill_after_s: float = 5.0,
    while_running=None,
    change_after_publish=None,
):
    """Publish `folder`, start its flow and drive it to the end; returns (run, driver)."""
    publication = rt.publish(folder)
    if change_after_publish is not None:
        change_after_publish()
    receipt = rt.start(publication.package, "flow")
    tasks = PublishedTasks(rt, {publication.package: folder} if folders is None else folders)
    executor = LocalProcessExecutor(
        rt, tasks.resolve, log_dir=tmp_path / "logs", ttl_ms=30_000, kill_after_s=kill_after_s
    )
    driver = Driver(
        rt, executor, worker_id="probe-worker", workers=2, interval_ms=50, until_run=receipt.run_id
    )
    watcher = None
    if while_running is not None:

        def watch():
            try:
                while_running(driver)
            except BaseException:
                driver.request_abort()  # a failed probe must not leave the loop running
                raise

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
    result = _run_with_deadline(driver, executor)
    if watcher is not None:
        watcher.join(10)
    return result.run, result


def _run_with_deadline(driver, executor, seconds: float = DRIVE_DEADLINE_S):
    """Run the host loop; abort it (so the test fails, never hangs) past a deadline."""
    deadline = threading.Timer(seconds, driver.request_abort)
    deadline.start()
    try:
        result = driver.run()
    finally:
        deadline.cancel()
        executor.close()
    assert not result.aborted, f"the host loop did not finish within {seconds} s"
    return result


def test_environment_output_and_exit_code_are_recorded(rt, tmp_path: Path):
    script = (
        'echo "run=$QLFLOW_RUN_ID step=$QLFLOW_STEP_KEY attempt=$QLFLOW_ATTEMPT_ID '
        'greeting=$GREETING cwd=$(pwd)"; echo oops >&2; exit 3'
    )
    folder = _package(
        tmp_path,
        f'[tasks.t]\ncommand = ["sh", "-c", {script!r}]\nenv = {{ GREETING = "hello" }}\n',
        '[{ key = "only", task = "t" }]',
    )

    run, _ = drive(rt, folder, tmp_path)

    step = run.steps["only"]
    attempt = step.attempts[0]
    assert (run.status, step.status, step.result_code) == ("failed", "failed", "execution_failed")
    assert attempt.exit_code == 3
    log_path = Path(attempt.log_path)
    assert log_path.parent.parent == tmp_path / "logs"
    greeting = (
        f"run={run.run_id} step=only attempt={attempt.attempt_id} greeting=hello "
        f"cwd={folder.resolve()}"
    )
    # stdout and stderr are two pipes: each keeps its order, the file has both
    assert sorted(log_path.read_text().splitlines()) == sorted([greeting, "oops"])
    stored = {}
    for chunk in rt.logs(run.run_id, "only"):
        stored[chunk.stream] = stored.get(chunk.stream, "") + chunk.text
    assert stored == {"stdout": greeting + "\n", "stderr": "oops\n"}


def test_a_command_that_cannot_start_fails_with_start_failed(rt, tmp_path: Path):
    folder = _package(
        tmp_path,
        '[tasks.t]\ncommand = ["./no-such-program"]\n',
        '[{ key = "only", task = "t" }, { key = "after", task = "t", needs = ["only"] }]',
    )

    run, result = drive(rt, folder, tmp_path)

    step = run.steps["only"]
    assert (step.status, step.result_code) == ("failed", "start_failed")
    assert "cannot start './no-such-program'" in step.attempts[0].error
    assert step.attempts[0].exit_code is None
    assert run.steps["after"].status == "skipped"
    assert [r.pid for r in result.reports] == [None]


def test_the_folder_recorded_at_publish_is_used_when_the_worker_knows_none(rt, tmp_path: Path):
    folder = _package(tmp_path, '[tasks.t]\ncommand = ["true"]\n', '[{ key = "only", task = "t" }]')

    run, _ = drive(rt, folder, tmp_path, folders={})

    assert run.steps["only"].status == "succeeded"


def test_a_package_folder_gone_since_publish_fails_to_start(rt, tmp_path: Path):
    folder = _package(tmp_path, '[tasks.t]\ncommand = ["true"]\n', '[{ key = "only", task = "t" }]')

    def move_away():
        folder.rename(tmp_path / "moved")

    run, _ = drive(rt, folder, tmp_path, folders={}, change_after_publish=move_away)

    step = run.steps["only"]
    assert (step.status, step.result_code) == ("failed", "start_failed")
    assert "does not exist" in step.attempts[0].error


def test_a_folder_changed_since_publication_never_runs(rt, tmp_path: Path):
    folder = _package(
        tmp_path,
        '[tasks.t]\ncommand = ["python3", "x.py"]\nfiles = ["x.py"]\n',
        '[{ key = "only", task = "t" }]',
        {"x.py": "open('ran', 'w').write('old')\n"},
    )

    def edit():
        (folder / "x.py").write_text("open('ran', 'w').write('new')\n")

    run, _ = drive(rt, folder, tmp_path, change_after_publish=edit)

    step = run.steps["only"]
    assert (step.status, step.result_code) == ("failed", "source_changed")
    assert "changed since probe generation 1 was published" in step.attempts[0].error
    assert not (folder / "ran").exists()


@pytest.mark.parametrize(
    "swap",
    ["symlink to /dev/zero", "symlink out of the folder", "a pipe", "too large"],
)
def test_a_file_swapped_after_publishing_is_refused_at_execution(rt, tmp_path: Path, swap):
    folder = _package(
        tmp_path,
        '[tasks.t]\ncommand = ["python3", "x.py"]\nfiles = ["x.py"]\n',
        '[{ key = "only", task = "t" }]',
        {"x.py": "open('ran', 'w').write('ran')\n"},
    )
    outside = tmp_path / "outside.py"
    outside.write_text("open('ran', 'w').write('ran')\n")

    def replace():
        (folder / "x.py").unlink()
        if swap == "symlink to /dev/zero":
            os.symlink("/dev/zero", folder / "x.py")
        elif swap == "symlink out of the folder":
            os.symlink(outside, folder / "x.py")
        elif swap == "a pipe":
            os.mkfifo(folder / "x.py")  # opening it to read would block forever
        else:
            with open(folder / "x.py", "wb") as handle:  # sparse: no disk, no time
                handle.truncate(MAX_TASK_FILE_BYTES + 1)

    before = time.process_time()
    run, _ = drive(rt, folder, tmp_path, change_after_publish=replace)  # within its deadline

    step = run.steps["only"]
    assert (step.status, step.result_code) == ("failed", TASK_FILE_REFUSED)
    error = step.attempts[0].error
    expected = {
        "symlink to /dev/zero": "leads outside the package folder",
        "symlink out of the folder": "leads outside the package folder",
        "a pipe": "is not a regular file",
        "too large": "larger than 64 MiB",
    }[swap]
    assert expected in error, error
    assert not (folder / "ran").exists()
    assert time.process_time() - before < 10  # nothing read /dev/zero or the pipe


def test_processes_a_finished_step_left_behind_are_killed(rt, tmp_path: Path):
    folder = _package(
        tmp_path,
        '[tasks.t]\ncommand = ["sh", "-c", "sleep 300 & echo $! > straggler.pid"]\n',
        '[{ key = "only", task = "t" }]',
    )

    run, _ = drive(rt, folder, tmp_path)

    assert run.status == "succeeded"
    straggler = read_pid(folder / "straggler.pid")
    assert straggler is not None
    wait_for(lambda: not process_alive(straggler), 5, "the straggler to be gone")


def test_cancel_sends_sigterm_then_sigkill_after_the_grace_period(rt, tmp_path: Path):
    hold = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open('hold.pid.tmp', 'w').write(str(os.getpid()))\n"
        "os.replace('hold.pid.tmp', 'hold.pid')\n"
        "time.sleep(300)\n"
    )
    folder = _package(
        tmp_path,
        '[tasks.t]\ncommand = ["python3", "hold.py"]\nfiles = ["hold.py"]\n',
        '[{ key = "only", task = "t" }]',
        {"hold.py": hold},
    )
    pid_file = folder / "hold.pid"

    drivers = []

    def cancel_once_started(driver):
        drivers.append(driver)
        wait_for(lambda: read_pid(pid_file), 20, "the step to start")
        driver.request_cancel()

    run, result = drive(rt, folder, tmp_path, kill_after_s=0.3, while_running=cancel_once_started)
    # the cancel was relayed to the running step; once nothing of the Run runs here,
    # the host's next tick remembers nothing of it (`serve` relays for a year)
    (driver,) = drivers
    driver._relay_cancel_intent()
    assert driver._relayed == set()

    pid = read_pid(pid_file)
    attempt = run.steps["only"].attempts[0]
    assert (run.status, run.cancel_reason) == ("cancelled", "user")
    assert attempt.status == "cancelled"
    assert attempt.pid == pid
    assert attempt.signal == "SIGKILL"  # SIGTERM was ignored
    assert attempt.stopped_by == "stop_requested"
    assert not process_alive(pid)
    assert result.reports[0].recorded_status == "cancelled"


def test_a_worker_that_loses_its_lease_kills_its_process_and_records_nothing(rt, tmp_path: Path):
    folder = _package(
        tmp_path,
        '[tasks.t]\ncommand = ["sh", "-c", "echo $$ > hold.pid; exec sleep 300"]\n',
        '[{ key = "only", task = "t" }]',
    )
    publication = rt.publish(folder)
    receipt = rt.start(publication.package, "flow")
    tasks = PublishedTasks(rt, {publication.package: folder})
    executor = LocalProcessExecutor(rt, tasks.resolve, log_dir=tmp_path / "logs")
    driver = Driver(rt, executor, worker_id="loser", workers=1, interval_ms=50)

    def current_lease():
        step = rt.get_run(receipt.run_id).steps["only"]
        attempt = step.attempts[0]
        return qlflow.Lease(
            lease_id=attempt.lease_id,
            attempt_id=attempt.attempt_id,
            run_id=receipt.run_id,
            step_key="only",
            task_ref=step.task_ref,
            version=attempt.lease_version,
            expires_at_ms=attempt.expires_at_ms,
            worker_id="loser",
        )

    def steal_the_lease(driver):
        pid = wait_for(lambda: read_pid(folder / "hold.pid"), 20, "the step to start")
        # the worker records the step running before anyone else touches its lease
        wait_for(
            lambda: rt.get_run(receipt.run_id).steps["only"].attempts[0].status == "running",
            20,
            "the worker to record the step running",
        )
        # One renewal behind, the worker's next renewal is answered as a replay with
        # this short expiry: it must renew again well before it, not ttl/3 later.
        short = rt.renew(current_lease(), ttl_ms=5_000)
        executor.renew_now()
        wait_for(lambda: current_lease().version > short.version, 4, "the worker to renew again")
        # Someone else renews twice: now the worker's version is stale for good.
        rt.renew(rt.renew(current_lease(), ttl_ms=30_000), ttl_ms=30_000)
        executor.renew_now()
        wait_for(lambda: driver.pool.finished, 10, "the worker to give up")
        driver.request_stop()
        return pid

    stolen = []

    def watch():
        try:
            stolen.append(steal_the_lease(driver))
        finally:
            driver.request_stop()  # a failed probe must not leave the loop running

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = _run_with_deadline(driver, executor)
    watcher.join(10)

    report = result.reports[0]
    assert report.recorded_status is None
    assert report.stopped_by == "lease_lost"
    assert report.pid == stolen[0]
    assert not process_alive(stolen[0])
    attempt = rt.get_run(receipt.run_id).steps["only"].attempts[0]
    assert attempt.status == "running"  # nothing recorded: recovery decides after expiry
