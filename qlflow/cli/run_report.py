"""How `qlflow run` ends: the Run's final document, why it did not succeed, or what
an interrupt left behind; and the exit status that says so."""

from __future__ import annotations

from rich.console import Console

from domain.transitions import STEP_LOST, STEP_PENDING, STEP_READY, STEP_RUNNING, Status
from projections.audit.failures import FAILED_ENDS
from projections.views import RunView
from qlflow.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, RUN_EXIT_CODES
from qlflow.cli.output import stderr_console, write_json
from qlflow.cli.tables import run_document
from qlflow.cli.times import when
from qlflow.clock import wall_clock_ms
from qlflow.driver import DriveResult
from qlflow.runtime import Runtime

UNFINISHED = (STEP_RUNNING, STEP_LOST, STEP_READY, STEP_PENDING)


def failed_lines(rt: Runtime, run: RunView, count: int = 10) -> dict[str, list[str]]:
    """The last lines of the log of each step whose latest Attempt failed, timed out or
    was lost (step key -> lines), for `show` and the end of `run`."""
    found = {}
    for key, step in sorted(run.steps.items()):
        attempt = step.attempts[-1] if step.attempts else None
        if attempt is not None and attempt.status in FAILED_ENDS:
            found[key] = rt.last_log_lines(attempt.attempt_id, count)
    return found


def report_run(
    console: Console, result: DriveResult, as_json: bool, rt: Runtime | None = None
) -> int:
    """Print how the drive ended (with the last log lines of failed steps when `rt` is
    given); returns the exit status."""
    run = result.run
    if result.aborted:
        _report_abort(result)
        if as_json:
            write_json({"run": run, "aborted": True})
        return EXIT_INTERRUPTED
    assert run is not None  # a drive of one Run returns only once it is terminal
    if as_json:
        write_json(run)
    else:
        lines = failed_lines(rt, run) if rt is not None else None
        console.print(run_document(run, last_lines=lines))
        if run.status != Status.SUCCEEDED:
            console.print(f"run {run.run_id} {run.status}" + _run_reason(run))
    return RUN_EXIT_CODES.get(run.status, EXIT_FAILED)


def _run_reason(run: RunView) -> str:
    if run.status == Status.FAILED:
        failed = [s.step_key for s in run.steps.values() if s.status == Status.FAILED]
        skipped = [s.step_key for s in run.steps.values() if s.status == Status.SKIPPED]
        text = f": failed {', '.join(failed) or '-'}"
        return text + (f"; skipped {', '.join(skipped)}" if skipped else "")
    if run.cancel_reason:
        return f" ({run.cancel_reason})"
    return ""


def _report_abort(result: DriveResult) -> None:
    err = stderr_console()
    run = result.run
    err.print("qlflow: interrupted again: exiting without waiting.")
    for process in result.left_running:
        err.print(
            f"  step {process.step_key}: attempt {process.attempt_id}, pid {process.pid} "
            "was killed (SIGKILL)"
        )
    if run is not None and not run.terminal:
        err.print(f"  run {run.run_id} is still running with cancel intent:")
        for step in run.steps.values():
            if step.status in UNFINISHED:
                attempt = step.attempts[-1] if step.attempts else None
                lease = (
                    f", lease held by {attempt.worker_id} until "
                    f"{when(attempt.expires_at_ms, wall_clock_ms())}"
                    if attempt and attempt.expires_at_ms
                    else ""
                )
                err.print(f"    {step.step_key}: {step.status}{lease}")
        err.print(f"  a later cycle settles it (qlflow cycle); see qlflow why {run.run_id}")
