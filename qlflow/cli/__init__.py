"""The `qlflow` command line: typer commands over `qlflow.open(...)`.

Every command opens the runtime on `--db` (default `$QLFLOW_DB`, else
`./qlflow.db`), does its work and closes it. Human output is rich tables;
`--json` writes one JSON document (JSON lines for `events --follow`).

The commands, by what a person does with them (and so in `--help`):
- run and host (`running`, `hosting`): start, run, cancel, cycle, worker, serve;
- inspect (`inspecting`, `step_logs`, `packages`, `schedules`): runs, show, events,
  why, logs, packages, schedules;
- administer (`administering`, `step_logs`, `export`): publish, rebuild, verify,
  pg-roles, prune, export, schedule pause|resume.

Exit status (`exits`): 0 ok (for `run`: the Run succeeded); 1 the Run failed (or
`verify` found differences); 2 bad input (any qlflow error, a missing path, a bad
`--db`); 3 the Run was cancelled; 4 it timed out; 130 interrupted without
waiting. An error is one line on stderr, `qlflow: error: ...`, never a traceback.
"""

# Importing a command module registers its commands; --help lists them in this order.
from qlflow.cli import running

# isort: split
from qlflow.cli import reruns

# isort: split
from qlflow.cli import hosting

# isort: split
from qlflow.cli import inspecting

# isort: split
from qlflow.cli import step_logs

# isort: split
from qlflow.cli import packages

# isort: split
from qlflow.cli import schedules

# isort: split
from qlflow.cli import limits

# isort: split
from qlflow.cli import notifying

# isort: split
from qlflow.cli import workers

# isort: split
from qlflow.cli import administering

# isort: split
from qlflow.cli import export

# isort: split
from qlflow.cli import retaining

# isort: split
from qlflow.cli.app import app
from qlflow.cli.entry import main

__all__ = [
    "administering",
    "app",
    "export",
    "hosting",
    "inspecting",
    "limits",
    "main",
    "notifying",
    "packages",
    "retaining",
    "reruns",
    "running",
    "schedules",
    "step_logs",
    "workers",
]
