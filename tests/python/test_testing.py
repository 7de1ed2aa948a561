"""`qlflow.testing.run_to_end`: a Run driven on a virtual clock, python Tasks called
in this process, the clock moved to the next instant the domain says is due."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from qlflow.testing import NotInProcess, VirtualClock, next_due, qlflow_runtime, run_to_end

__all__ = ["qlflow_runtime"]  # the fixture, as a user's conftest.py would register it

T0 = 1_800_000_000_000


def _package(tmp_path: Path, flows: str, tasks: str = "") -> Path:
    folder = tmp_path / "pkg"
    (folder / "steps").mkdir(parents=True)
    (folder / "steps" / "work.py").write_text(
        textwrap.dedent(
            """
            def ok(ctx):
                ctx.log.info("ran attempt %d", ctx.attempt)
                return {"attempt": ctx.attempt}

            def always_fails(ctx):
                raise RuntimeError(f"attempt {ctx.attempt} failed")

            def bad_output(ctx):
                return ["not", "an", "object"]
            """
        )
    )
    python_tasks = "".join(
        f'[tasks.{name}]\npython = "steps.work:{name}"\nfiles = ["steps/work.py"]\n'
        for name in ("ok", "always_fails", "bad_output")
    )
    (folder / "qlflow.toml").write_text(
        '[package]\nname = "pkg"\npublisher = "tests"\n'
        + python_tasks
        + textwrap.dedent(tasks)
        + textwrap.dedent(flows)
    )
    return folder


def test_each_retry_waits_its_backoff_on_the_virtual_clock_only(qlflow_runtime, tmp_path):
    folder = _package(
        tmp_path,
        """
        [workflows.flow]
        steps = [
          {key = "a", task = "always_fails", retry = {max_attempts = 3, backoff_ms = 600000}},
          {key = "b", task = "ok", needs = ["a"]},
        ]
        """,
    )
    clock = VirtualClock(T0)
    run = run_to_end(qlflow_runtime, folder, "flow", clock=clock)
    assert run.status == "failed"
    step = run.steps["a"]
    assert [a.result_code for a in step.attempts] == ["exception"] * 3
    assert clock.now_ms == T0 + 2 * 600_000  # two backoffs between three Attempts
    assert run.steps["b"].attempts == []
    logs = b"".join(c.data for c in qlflow_runtime.logs(run.run_id, "a")).decode()
    assert "RuntimeError: attempt 3 failed" in logs


def test_outputs_logs_and_output_invalid(qlflow_runtime, tmp_path):
    folder = _package(
        tmp_path,
        """
        [workflows.flow]
        steps = [{key = "a", task = "ok"}, {key = "b", task = "bad_output", needs = ["a"]}]
        """,
    )
    clock = VirtualClock(T0)
    run = run_to_end(qlflow_runtime, folder, "flow", clock=clock)
    assert clock.now_ms == T0  # nothing had to wait
    assert run.steps["a"].output == {"attempt": 1}
    assert (run.steps["b"].status, run.steps["b"].result_code) == ("failed", "output_invalid")
    logs = b"".join(c.data for c in qlflow_runtime.logs(run.run_id, "a")).decode()
    assert "INFO qlflow.task.a: ran attempt 1" in logs


def test_a_command_task_is_refused_naming_the_step(qlflow_runtime, tmp_path):
    folder = _package(
        tmp_path,
        '[workflows.flow]\nsteps = [{key = "c", task = "cmd"}]\n',
        tasks='[tasks.cmd]\ncommand = ["true"]\n',
    )
    with pytest.raises(NotInProcess, match="step 'c' runs a command"):
        run_to_end(qlflow_runtime, folder, "flow", clock=VirtualClock(T0))


def test_next_due_is_the_first_window_the_domain_opens_later(qlflow_runtime, tmp_path):
    folder = _package(
        tmp_path,
        """
        [workflows.flow]
        timeout_ms = 900000
        steps = [{key = "a", task = "ok"}]
        """,
    )
    qlflow_runtime.publish(folder, now_ms=T0)
    receipt = qlflow_runtime.start("pkg", "flow", now_ms=T0)
    # the root is claimable now; the next instant anything changes is the deadline
    assert next_due(qlflow_runtime, receipt.run_id, T0) == T0 + 900_000
    assert next_due(qlflow_runtime, receipt.run_id, T0 + 900_000) is None
