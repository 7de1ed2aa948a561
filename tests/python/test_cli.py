"""`qlflow run` runs python Tasks: a package of functions, driven to its end."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.cli.helpers import qlflow_json


def test_qlflow_run_runs_a_package_of_functions(tmp_path: Path) -> None:
    folder = tmp_path / "fns"
    (folder / "fns").mkdir(parents=True)
    (folder / "fns" / "steps.py").write_text(
        textwrap.dedent(
            """
            def first(ctx):
                print("first ran")
                return {"n": ctx.params["n"] * 2}

            def second(ctx):
                return {"got": ctx.needs["first"]["n"], "attempt": ctx.attempt}
            """
        )
    )
    (folder / "qlflow.toml").write_text(
        textwrap.dedent(
            """
            [package]
            name = "fns"
            publisher = "tests"
            [tasks.first]
            python = "fns.steps:first"
            files = ["fns/steps.py"]
            [tasks.second]
            python = "fns.steps:second"
            files = ["fns/steps.py"]
            isolation = "thread"
            [workflows.flow]
            steps = [{key = "first", task = "first"},
                     {key = "second", task = "second", needs = ["first"]}]
            params = { n = { type = "integer" } }
            """
        )
    )
    db = f"sqlite:///{tmp_path / 'q.db'}"
    run = qlflow_json("run", str(folder), "flow", "-p", "n=21", db=db, cwd=tmp_path)
    assert run["status"] == "succeeded"
    assert run["steps"]["second"]["attempts"][0]["output"] == {"got": 42, "attempt": 1}
    logs = qlflow_json("logs", run["run_id"], "first", db=db, cwd=tmp_path)
    assert "first ran" in str(logs)
