"""The Run's trace context reaches what it runs: a command's TRACEPARENT and a Python
Task's `ctx.traceparent` name the Run's trace (ids derived from the run id, the
same ones `qlflow.tracing` parents the Run's spans with)."""

from __future__ import annotations

import re
from pathlib import Path

from opentelemetry import propagate, trace

from qlflow import trace_context
from tests.cli.helpers import qlflow, qlflow_json
from tests.python.test_call import _call, _folder, _invoke

W3C = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01")

MODULE = """
from opentelemetry import propagate, trace

def told(ctx):
    span = trace.get_current_span(propagate.extract(ctx.trace_headers()))
    return {"traceparent": ctx.traceparent, "trace_id": f"{span.get_span_context().trace_id:032x}"}
"""


def test_a_python_task_gets_the_runs_trace_context(tmp_path: Path) -> None:
    outcome, _ = _invoke(_call(_folder(tmp_path, MODULE), "told"))
    expected = trace_context.traceparent("run:x", "wta:x")
    assert W3C.fullmatch(expected)
    assert outcome.output == {
        "traceparent": expected,
        "trace_id": f"{trace_context.trace_id('run:x'):032x}",
    }


def test_a_command_gets_traceparent_in_its_environment(tmp_path: Path) -> None:
    package = tmp_path / "tp"
    package.mkdir()
    (package / "qlflow.toml").write_text(
        '[package]\nname = "tp"\npublisher = "acme"\n\n'
        '[tasks.show]\ncommand = ["sh", "-c", "echo \\"tp=$TRACEPARENT\\""]\n\n'
        '[workflows.w]\nsteps = [{ key = "s", task = "show" }]\n'
    )
    db = f"sqlite:///{tmp_path / 'q.db'}"
    done = qlflow("run", str(package), "w", "--run-id", "tp-1", db=db, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [attempt] = qlflow_json("show", "tp-1", db=db, cwd=tmp_path)["steps"]["s"]["attempts"]
    log = Path(attempt["execution"]["log_path"]).read_text()
    told = re.search(r"tp=(\S+)", log).group(1)
    assert told == trace_context.traceparent("tp-1", attempt["attempt_id"])
    parent = trace.get_current_span(propagate.extract({"traceparent": told})).get_span_context()
    assert parent.trace_id == trace_context.trace_id("tp-1")
