"""Outputs are outputs: a step's output is only what it wrote to $QLFLOW_OUTPUT (None
when it wrote nothing); its exit code, signal, pid and log path are the Attempt's
`execution`, shown with the Attempt and passed to no step. Old completions that held
the executor's record in `output` read as that record."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from domain import execution
from projections import runs as runs_projection
from qlflow.cli.tables import run_document
from tests.cli.test_executor import _package, drive, rt  # noqa: F401  (the fixture)


def test_no_output_is_null_downstream_and_the_exit_code_is_the_attempts(rt, tmp_path: Path):  # noqa: F811
    folder = _package(
        tmp_path,
        '[tasks.quiet]\ncommand = ["sh", "-c", "exit 0"]\n'
        '[tasks.speaks]\ncommand = ["sh", "-c", "echo \'{\\"rows\\": 7}\' > $QLFLOW_OUTPUT"]\n'
        '[tasks.reads]\ncommand = ["sh", "-c", "cat $QLFLOW_INPUTS > inputs.json"]\n',
        '[{ key = "a", task = "quiet" }, { key = "b", task = "speaks" },'
        ' { key = "c", task = "reads", needs = ["a", "b"] }]',
    )

    run, _ = drive(rt, folder, tmp_path)

    assert run.status == "succeeded"
    quiet, speaks = run.steps["a"].attempts[0], run.steps["b"].attempts[0]
    assert (quiet.output, run.steps["a"].output) == (None, None)
    assert (quiet.exit_code, quiet.signal) == (0, None)
    assert quiet.pid is not None and Path(quiet.log_path or "").is_file()
    assert (speaks.output, speaks.exit_code) == ({"rows": 7}, 0)
    assert speaks.log_path is not None
    inputs = json.loads((folder / "inputs.json").read_text())
    assert inputs["needs"] == {"a": None, "b": {"rows": 7}}  # nothing of the executor's
    shown = str(_render(run))
    assert shown.count("exit 0") == 3  # every step, output or not
    assert speaks.log_path in shown


def test_a_failed_step_shows_its_exit_code_beside_its_output(rt, tmp_path: Path):  # noqa: F811
    folder = _package(
        tmp_path,
        '[tasks.t]\ncommand = ["sh", "-c", "echo \'{\\"half\\": 1}\' > $QLFLOW_OUTPUT; exit 4"]\n',
        '[{ key = "only", task = "t" }]',
    )

    run, _ = drive(rt, folder, tmp_path)

    attempt = run.steps["only"].attempts[0]
    assert (attempt.status, attempt.output, attempt.exit_code) == ("failed", {"half": 1}, 4)
    assert "exit 4" in _render(run)
    why = rt.why(run.run_id)
    assert [(f.step_key, f.exit_code) for f in why.failures] == [("only", 4)]


def test_an_old_executor_record_in_output_reads_as_the_execution():
    old = {"output": {"exit_code": 0, "log_path": "/l/a.log", "pid": 9}, "result_code": None}
    assert execution.split(old) == (None, {"exit_code": 0, "log_path": "/l/a.log", "pid": 9})
    # a new event says which is which, whatever the output looks like
    new = {**old, "execution": None}
    assert execution.split(new) == ({"exit_code": 0, "log_path": "/l/a.log", "pid": 9}, None)
    # an output of the task's own is never taken for one
    assert execution.split({"output": {"exit_code": 0, "rows": 1}}) == (
        {"exit_code": 0, "rows": 1},
        None,
    )


def test_an_upgraded_store_splits_the_old_records_as_a_replay_does(rt, tmp_path: Path):  # noqa: F811
    folder = _package(tmp_path, '[tasks.t]\ncommand = ["true"]\n', '[{ key = "only", task = "t" }]')
    run, _ = drive(rt, folder, tmp_path)
    attempt = run.steps["only"].attempts[0]
    legacy = {"exit_code": 0, "log_path": attempt.log_path, "pid": attempt.pid}
    with rt.store.transaction() as tx:  # as an attempts row folded before the column was
        tx.execute(
            "UPDATE attempts SET output = ?, execution = NULL WHERE attempt_id = ?",
            (orjson.dumps(legacy).decode(), attempt.attempt_id),
        )

    runs_projection.backfill(rt.store, runs_projection.EXECUTION_STEP - 1)

    again = rt.get_run(run.run_id).steps["only"].attempts[0]
    assert (again.output, again.exit_code, again.log_path) == (None, 0, attempt.log_path)


def _render(run) -> str:
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(run_document(run))
    return console.export_text()
