"""Running the real `qlflow` entry point in subprocesses, and polling with deadlines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import orjson

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
COMMAND_TIMEOUT_S = 60

T = TypeVar("T")


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("QLFLOW_DB", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "200"
    env.update(extra or {})
    return env


def argv(*args: str, db: str | None) -> list[str]:
    prefix = [sys.executable, "-m", "qlflow.cli"]
    return [*prefix, *(["--db", db] if db is not None else []), *args]


def qlflow(
    *args: str,
    db: str | None,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = COMMAND_TIMEOUT_S,
) -> subprocess.CompletedProcess:
    """Run `qlflow [--db DB] ARGS` to its end; stdout and stderr as text."""
    return subprocess.run(
        argv(*args, db=db),
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def qlflow_json(*args: str, db: str | None, cwd: Path, env=None):
    done = qlflow(*args, "--json", db=db, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def qlflow_many(
    commands: dict[str, tuple[str, ...]], *, db: str | None, cwd: Path, env=None
) -> dict[str, subprocess.CompletedProcess]:
    """Run independent `qlflow` commands at once (each its own process)."""
    running = {
        name: subprocess.Popen(
            argv(*args, db=db),
            cwd=cwd,
            env=cli_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    done = {}
    for name, process in running.items():
        stdout, stderr = process.communicate(timeout=COMMAND_TIMEOUT_S)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return done


def json_of(done: subprocess.CompletedProcess):
    """The JSON document a successful command printed."""
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


class Spawned:
    """A `qlflow` process running in the background, its output in files (no pipe
    can fill up and stall it)."""

    def __init__(self, *args: str, db: str | None, cwd: Path, env=None, name: str = "qlflow"):
        self.stdout_path = cwd / f"{name}.out"
        self.stderr_path = cwd / f"{name}.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                argv(*args, db=db), cwd=cwd, env=cli_env(env), stdout=out, stderr=err
            )

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8")

    def wait(self, timeout: float = COMMAND_TIMEOUT_S) -> int:
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def wait_for(probe: Callable[[], T | None], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def copy_example(name: str, tmp_path: Path) -> Path:
    """A private copy of examples/<name> (steps write into their package folder)."""
    target = tmp_path / name
    shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("data", "*.tgz"))
    return target


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'qlflow.db'}"


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


def process_alive(pid: int) -> bool:
    """True if `pid` names a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def one_error_line(stderr: str) -> str:
    """The single `qlflow: error: ...` line a bad input must produce."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("qlflow: error: "), stderr
    return lines[0]


def write_package(folder: Path, toml: str, files: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qlflow.toml").write_text(toml, encoding="utf-8")
    for name, text in (files or {}).items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder
