"""Bad input through the real entry point: one clear line on stderr, exit status 2,
no traceback, and nothing written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qlflow.cli import app
from tests.cli.helpers import (
    argv,
    cli_env,
    copy_example,
    one_error_line,
    qlflow,
    sqlite_url,
    write_package,
)

MALFORMED = '[package]\nname = "broken"\npublisher = "tests"\n[tasks.x\ncommand = ["true"]\n'


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every bad-input command, run at once (each is its own process)."""
    root = tmp_path_factory.mktemp("bad")
    nightly = copy_example("nightly", root)
    broken = write_package(root / "broken", MALFORMED)
    db = sqlite_url(root)
    # the store exists (empty) before the commands race: read commands never create it
    assert qlflow("cycle", db=db, cwd=root).returncode == 0
    cases = {
        "missing folder": ("run", str(root / "nowhere"), "nightly"),
        "malformed toml": ("run", str(broken), "x"),
        "malformed toml publish": ("publish", str(broken)),
        "unknown workflow": ("run", str(nightly), "weekly"),
        "unknown package": ("start", "nosuch", "nightly"),
        "unknown run": ("show", "run:nosuch"),
        "bad option": ("runs", "--limit", "zero"),
        "missing argument": ("run", str(nightly)),
        "negative limit": ("events", "--limit", "0"),
        "worker without package": ("worker", "--once"),
        "ttl out of range": ("run", str(nightly), "nightly", "--ttl-ms", "1000"),
    }
    bad_dbs = {
        "bad --db scheme": ("mysql://localhost/q", ("runs",)),
        "bad --db directory": (f"sqlite:///{root / 'no' / 'such' / 'q.db'}", ("runs",)),
        "bad --db not a url": ("qlflow.db", ("runs",)),
        "unreachable postgres": (
            "postgresql://nobody@127.0.0.1:1/none",
            ("--connect-timeout-s", "1", "runs"),
        ),
    }
    started = {}
    for name, args in cases.items():
        started[name] = _popen(argv(*args, db=db), root)
    for name, (url, args) in bad_dbs.items():
        started[name] = _popen(argv(*args, db=url), root)
    results = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=60)
        results[name] = (
            subprocess.CompletedProcess(process.args, process.returncode, out, err),
            root,
        )
    return results


def _popen(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command, cwd=cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


COMMANDS = (
    "publish",
    "start",
    "run",
    "cancel",
    "cycle",
    "worker",
    "serve",
    "runs",
    "show",
    "events",
    "why",
    "rebuild",
    "verify",
)

EXPECTED = {
    "missing folder": "does not exist",
    "malformed toml": "TOML syntax error",
    "malformed toml publish": "TOML syntax error",
    "unknown workflow": "has no workflow 'weekly' (workflows: nightly)",
    "unknown package": "nosuch",
    "unknown run": "run:nosuch",
    "bad option": "'--limit': input should be a valid integer",
    "missing argument": "WORKFLOW",
    "negative limit": "--limit must be at least 1",
    "worker without package": "a worker needs --package-dir",
    "ttl out of range": "--ttl-ms must be between 5000 and 600000",
    "bad --db scheme": "unknown store URL scheme 'mysql'",
    "bad --db directory": "does not exist",
    "bad --db not a url": "sqlite:///path.db",
}
UNAVAILABLE = {
    "unreachable postgres": "cannot open the database postgresql://nobody@127.0.0.1:1/none: "
    "connection failed",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_input_is_one_clear_line_and_exit_2(bad_inputs, case):
    done, _root = bad_inputs[case]
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = one_error_line(done.stderr)
    assert EXPECTED[case].lower() in line.lower(), line
    assert done.stdout == ""


@pytest.mark.parametrize("case", sorted(UNAVAILABLE))
def test_a_store_that_cannot_be_reached_is_one_clear_line_and_exit_5(bad_inputs, case):
    done, _root = bad_inputs[case]
    assert done.returncode == 5, (done.stdout, done.stderr)
    line = one_error_line(done.stderr)
    assert UNAVAILABLE[case].lower() in line.lower(), line
    assert done.stdout == ""


def test_refused_commands_write_nothing(bad_inputs):
    _done, root = bad_inputs["unknown workflow"]
    done = qlflow("events", "--json", db=sqlite_url(root), cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_help_explains_every_command_with_an_example(tmp_path: Path):
    top = qlflow("--help", db=None, cwd=tmp_path)
    assert top.returncode == 0
    assert "Example" in top.stdout
    # a summary wrapped in its docstring is one line in the table (typer's rich mode
    # printed the source's line break mid-sentence)
    lines = top.stdout.splitlines()
    assert any("cancel" in line and "and its completion ends the Run" in line for line in lines)
    runner = CliRunner()
    for command in COMMANDS:
        assert command in top.stdout
        page = runner.invoke(app, [command, "--help"], terminal_width=200)
        assert page.exit_code == 0, page.output
        assert "Example" in page.output, command
        assert f"qlflow {command}" in page.output, command
