"""The local executor of a command-line host (`run`, `worker`, `serve`): where its
step logs go and which worker id it leases under."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import typer

from domain.errors import QlflowError
from qlflow.cli.app import settings
from qlflow.executor import LocalProcessExecutor, PublishedTasks
from qlflow.python.executor import PythonExecutor
from qlflow.python.routing import TaskRouter
from qlflow.runtime import Runtime

LOG_DIR_NAME = ".qlflow-logs"


def default_log_dir(url: str) -> Path:
    """Logs live next to an SQLite database; for PostgreSQL, in the working directory."""
    from eventstore.url import database_file

    try:
        path = database_file(url)
    except QlflowError:
        return Path.cwd() / LOG_DIR_NAME
    if path is not None:
        return Path(path).resolve().parent / LOG_DIR_NAME
    return Path.cwd() / LOG_DIR_NAME


def default_worker_id() -> str:
    """This host's worker id: host name and pid."""
    return f"{socket.gethostname()[:80]}-{os.getpid()}"


def local_executor(
    ctx: typer.Context,
    rt: Runtime,
    tasks: PublishedTasks,
    *,
    log_dir: Path | None,
    ttl_ms: int,
    kill_after_ms: int,
) -> TaskRouter:
    """The executors of this host, commands and python Tasks, writing step logs to
    `log_dir` (or the default)."""
    folder = log_dir or default_log_dir(settings(ctx).url)
    commands = LocalProcessExecutor(
        rt, tasks.resolve, log_dir=folder, ttl_ms=ttl_ms, kill_after_s=kill_after_ms / 1000
    )
    python = PythonExecutor(
        rt, tasks.resolve, log_dir=folder, ttl_ms=ttl_ms, kill_after_s=kill_after_ms / 1000
    )
    return TaskRouter(tasks, commands, python)
