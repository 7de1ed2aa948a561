"""The `qlflow` command line (SPEC §12): typer commands over `qlflow.open(...)`.

Every command opens the runtime on `--db` (default `$QLFLOW_DB`, else
`./qlflow.db`), does its work and closes it. Human output is rich tables;
`--json` writes one JSON document (JSON lines for `events --follow`).

Exit status: 0 ok (for `run`: the Run succeeded); 1 the Run failed (or `verify`
found differences); 2 bad input (any qlflow error, a missing path, a bad
`--db`); 3 the Run was cancelled; 4 it timed out; 130 interrupted without
waiting. An error is one line on stderr, `qlflow: error: ...`, never a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from domain.errors import CorruptionError, NotFound, QlflowError
from qlflow import cli_render as render
from qlflow.driver import (
    DEFAULT_RUN_INTERVAL_MS,
    DEFAULT_SERVE_INTERVAL_MS,
    CycleFailing,
    Driver,
    DriveResult,
)
from qlflow.executor import DEFAULT_KILL_AFTER_S, LocalProcessExecutor, PublishedTasks

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_CANCELLED = 3
EXIT_TIMED_OUT = 4
EXIT_INTERRUPTED = 130
RUN_EXIT_CODES = {
    "succeeded": EXIT_OK,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
    "timed_out": EXIT_TIMED_OUT,
}
LOG_DIR_NAME = ".qlflow-logs"
MIN_TTL_MS, MAX_TTL_MS = 5_000, 600_000  # SPEC §5: lease TTL 5 s to 10 min

log = logging.getLogger("qlflow.cli")
_verbosity = 0  # set by the global options; -vv shows the traceback of an internal error


class CliError(Exception):
    """A problem the command line reports as one line, with an exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Settings:
    """The global options, shared by every command through the click context."""

    db: str | None
    profile: str | None
    json: bool
    connect_timeout_s: float | None = None

    @property
    def url(self) -> str:
        from qlflow.runtime import default_url

        return self.db or default_url()


app = typer.Typer(
    name="qlflow",
    help=(
        "Run durable DAG workflows (plugin package workflows) on SQLite or PostgreSQL.\n\n"
        "A package is a folder with a [bold]qlflow.toml[/bold]. Publish it, start a "
        "Workflow, and let a host drive it: [bold]qlflow run[/bold] does all three "
        "in one go; [bold]qlflow serve[/bold] is a long-running host; "
        "[bold]qlflow worker[/bold] runs Attempts for a host that cycles elsewhere."
    ),
    epilog=(
        "Example: [bold]qlflow run examples/nightly nightly[/bold]  (embedded SQLite in "
        "./qlflow.db)\n\n"
        "Exit status: 0 ok, 1 run failed, 2 bad input, 3 run cancelled, 4 run timed out, "
        "130 interrupted."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonOption = Annotated[bool, typer.Option("--json", help="Write one JSON document to stdout.")]


@app.callback()
def _global_options(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help=(
                "Store URL: sqlite:///relative.db, sqlite:////abs/path.db or "
                "postgresql://user@host/db. Default: $QLFLOW_DB, else ./qlflow.db."
            ),
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="edge | standalone | cluster (default: standalone on SQLite, cluster on "
            "PostgreSQL).",
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Machine output for every read command.")
    ] = False,
    connect_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--connect-timeout-s",
            help="PostgreSQL: give up connecting after this many seconds (default 10).",
        ),
    ] = None,
    verbose: Annotated[
        int,
        typer.Option("-v", "--verbose", count=True, help="Log to stderr (-v info, -vv debug)."),
    ] = 0,
) -> None:
    global _verbosity
    _verbosity = verbose
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="qlflow: %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    if connect_timeout_s is not None and connect_timeout_s <= 0:
        raise CliError(f"--connect-timeout-s must be positive, got {connect_timeout_s}")
    ctx.obj = Settings(db=db, profile=profile, json=json_out, connect_timeout_s=connect_timeout_s)


# -- shared helpers ---------------------------------------------------------------


def _settings(ctx: typer.Context) -> Settings:
    return ctx.obj if isinstance(ctx.obj, Settings) else Settings(None, None, False)


def _wants_json(ctx: typer.Context, json_out: bool) -> bool:
    return json_out or _settings(ctx).json


def redact(url: str) -> str:
    """A store URL fit to print: a PostgreSQL password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, at, host = rest.rpartition("@")
    user, colon, _password = credentials.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}{at}{host}"


@contextlib.contextmanager
def opened(ctx: typer.Context) -> Iterator[Any]:
    """The runtime on `--db`; a database that cannot be opened is one clear error."""
    import qlflow

    settings = _settings(ctx)
    url = settings.url
    options = {}
    if settings.connect_timeout_s is not None and url.startswith(("postgresql:", "postgres:")):
        options["connect_timeout_s"] = settings.connect_timeout_s
    # The connection pool logs every failed attempt; keep the last one as the reason
    # instead of letting each print (and the final error say only "timed out").
    pool_log = logging.getLogger("psycopg.pool")
    reason = _LastWarning()
    pool_log.addHandler(reason)
    propagate, pool_log.propagate = pool_log.propagate, _verbosity > 0
    try:
        rt = qlflow.open(url, settings.profile, **options)
    except QlflowError as error:
        raise CliError(f"--db {redact(url)}: {error}") from None
    except Exception as error:  # sqlite3 / psycopg / OS errors, by driver
        cause = reason.message or str(error).strip() or repr(error)
        cause = re.sub(r"^error connecting in '[^']*': ", "", cause)
        raise CliError(f"cannot open the database {redact(url)}: {cause.splitlines()[0]}") from None
    finally:
        pool_log.removeHandler(reason)
        pool_log.propagate = propagate
    try:
        yield rt
    finally:
        rt.close()


class _LastWarning(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()


def _console():
    return render.stdout_console()


def _package_folder(path: Path) -> Path:
    """A package folder (or its qlflow.toml) that exists; a clear error otherwise."""
    if not path.exists():
        raise CliError(f"package folder {str(path)!r} does not exist")
    folder = path.parent if path.is_file() else path
    return folder.resolve()


def _default_log_dir(url: str) -> Path:
    """Logs live next to an SQLite database; for PostgreSQL, in the working directory."""
    from eventstore.url import database_file

    try:
        path = database_file(url)
    except QlflowError:
        return Path.cwd() / LOG_DIR_NAME
    if path is not None:
        return Path(path).resolve().parent / LOG_DIR_NAME
    return Path.cwd() / LOG_DIR_NAME


def _default_worker_id() -> str:
    return f"{socket.gethostname()[:80]}-{os.getpid()}"


def _split_list(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _positive(name: str, value: int | None, low: int = 1) -> None:
    if value is not None and value < low:
        raise CliError(f"{name} must be at least {low}, got {value}")


def _check_ttl(ttl_ms: int) -> None:
    if not MIN_TTL_MS <= ttl_ms <= MAX_TTL_MS:
        raise CliError(
            f"--ttl-ms must be between {MIN_TTL_MS} and {MAX_TTL_MS} (5 s to 10 min), got {ttl_ms}"
        )


def _executor(
    ctx: typer.Context,
    rt,
    tasks: PublishedTasks,
    *,
    log_dir: Path | None,
    ttl_ms: int,
    kill_after_ms: int,
) -> LocalProcessExecutor:
    return LocalProcessExecutor(
        rt,
        tasks.resolve,
        log_dir=log_dir or _default_log_dir(_settings(ctx).url),
        ttl_ms=ttl_ms,
        kill_after_s=kill_after_ms / 1000,
    )


class SignalRelay:
    """Delivers SIGINT / SIGTERM to `on_signal` on a helper thread.

    A Python signal handler runs on the main thread between bytecodes, possibly
    while that thread holds a lock the handler would need (an Event's, say). Here
    the C-level handler only writes the signal number to a pipe (the wakeup fd),
    and a thread reads it and calls `on_signal(signum)` — never re-entrant.
    """

    def __init__(self, on_signal: Callable[[int], None], signals=(signal.SIGINT, signal.SIGTERM)):
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, _ignore_in_python) for signum in signals}
        self._on_signal = on_signal
        self._thread = threading.Thread(target=self._relay, name="signals", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                self._on_signal(signum)

    def close(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write_fd)
        self._thread.join(1.0)
        os.close(self._read_fd)

    def __enter__(self) -> SignalRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ignore_in_python(signum, frame) -> None:
    """The wakeup fd carries the signal; the Python-level handler does nothing."""


# -- publish / start ------------------------------------------------------------------


@app.command(
    epilog="Example: [bold]qlflow publish examples/nightly[/bold]  (prints the publication; "
    "publishing unchanged content again is a no-op)"
)
def publish(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Package folder (or its qlflow.toml).")],
    json_out: JsonOption = False,
) -> None:
    """Publish a package folder: a new generation when its content changed."""
    folder = _package_folder(path)
    with opened(ctx) as rt:
        publication = rt.publish(folder)
    if _wants_json(ctx, json_out):
        render.write_json(publication)
    else:
        _console().print(render.publication_table(publication))


@app.command(
    epilog="Example: [bold]qlflow start backup nightly --admission-key nightly-2024-05-01"
    "[/bold]  (the same key again returns the same Run; a host must drive it: "
    "[bold]qlflow serve[/bold])"
)
def start(
    ctx: typer.Context,
    package: Annotated[str, typer.Argument(help="Package name (from its qlflow.toml).")],
    workflow: Annotated[str, typer.Argument(help="Workflow key.")],
    admission_key: Annotated[
        str | None, typer.Option(help="Idempotency key: the same key gives the same Run.")
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="Choose the run id.")] = None,
    timeout_ms: Annotated[
        int | None, typer.Option(help="Aggregate timeout of the Run (ms).")
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Admit a Workflow Run of the package's current publication (no host needed)."""
    _positive("--timeout-ms", timeout_ms)
    with opened(ctx) as rt:
        receipt = rt.start(
            package, workflow, admission_key=admission_key, run_id=run_id, timeout_ms=timeout_ms
        )
    if _wants_json(ctx, json_out):
        render.write_json(receipt)
    else:
        console = _console()
        console.print(render.receipt_table(receipt))
        console.print(
            "nothing runs until a host drives it: qlflow serve --package-dir FOLDER "
            "(or qlflow cycle with qlflow worker --package-dir FOLDER)"
        )


# -- run --------------------------------------------------------------------------------


class RunProgress:
    """Live progress of one Run: a rich Live table on a terminal, else one line per
    step status change (readable in CI logs and pipes)."""

    def __init__(self, console, run_id: str, enabled: bool = True) -> None:
        self.console = console
        self.run_id = run_id
        self.enabled = enabled
        self.live_mode = enabled and console.is_terminal
        self._live: Live | None = None
        self._seen: dict[str, tuple[str, int]] = {}
        self.notices: list[str] = []
        self._lock = threading.Lock()

    def __enter__(self) -> RunProgress:
        if self.live_mode:
            self._live = Live(
                Text(f"run {self.run_id}: starting"),
                console=self.console,
                refresh_per_second=8,
                transient=True,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def notice(self, message: str) -> None:
        """A line for the user (shown above the live table, or printed)."""
        with self._lock:
            self.notices.append(message)

    def update(self, run) -> None:
        with self._lock:
            notices, self.notices = self.notices, []
        for message in notices:
            render.stderr_console().print(message)
        if not self.enabled:
            return
        if self._live is not None:
            title = Text.assemble(
                f"run {run.run_id} ", render.status_text(run.status), f"  v{run.version}"
            )
            if run.cancel_requested_at_ms is not None:
                title.append(f"  cancelling ({run.cancel_reason})", style="yellow")
            self._live.update(
                render.Group(title, render.steps_table(run, detail=False)), refresh=True
            )
            return
        for step in run.steps.values():
            attempt = step.attempts[-1] if step.attempts else None
            state = (step.status, attempt.attempt_number if attempt else 0)
            if self._seen.get(step.step_key) != state:
                self._seen[step.step_key] = state
                suffix = f" (attempt #{state[1]})" if attempt else ""
                code = f" [{step.result_code}]" if step.result_code else ""
                self.console.print(
                    f"{render.at(_now_ms())}  {step.step_key}: {step.status}{suffix}{code}"
                )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@app.command(
    epilog=(
        "Example: [bold]qlflow run examples/nightly nightly[/bold]\n\n"
        "Ctrl-C records a cancel intent (reason user) and keeps converging until the Run "
        "is terminal: running steps get SIGTERM, then SIGKILL after --kill-after-ms. "
        "A second Ctrl-C exits at once and says what is left.\n\n"
        "Exit status: 0 succeeded, 1 failed, 3 cancelled, 4 timed out, 2 bad input, "
        "130 interrupted without waiting."
    )
)
def run(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Package folder (or its qlflow.toml).")],
    workflow: Annotated[str, typer.Argument(help="Workflow key to run.")],
    workers: Annotated[int, typer.Option(help="Steps run at once.")] = 4,
    interval_ms: Annotated[
        int, typer.Option(help="Cycle interval while waiting (a finished step wakes it).")
    ] = DEFAULT_RUN_INTERVAL_MS,
    ttl_ms: Annotated[int, typer.Option(help="Lease TTL; renewed every TTL/3.")] = 30_000,
    kill_after_ms: Annotated[int, typer.Option(help="SIGKILL this long after SIGTERM.")] = int(
        DEFAULT_KILL_AFTER_S * 1000
    ),
    timeout_ms: Annotated[
        int | None, typer.Option(help="Aggregate timeout of the Run (ms).")
    ] = None,
    admission_key: Annotated[str | None, typer.Option(help="Idempotency key.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Choose the run id.")] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option(help="Where step logs go (default: .qlflow-logs next to the database)."),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Publish, start and drive a Workflow until its Run is terminal, with live progress."""
    _positive("--workers", workers)
    _positive("--interval-ms", interval_ms)
    _positive("--timeout-ms", timeout_ms)
    _check_ttl(ttl_ms)
    _positive("--kill-after-ms", kill_after_ms, 0)
    folder = _package_folder(path)
    _check_workflow(folder, workflow)
    as_json = _wants_json(ctx, json_out)
    console = _console()
    with opened(ctx) as rt:
        publication = rt.publish(folder)
        receipt = rt.start(
            publication.package,
            workflow,
            admission_key=admission_key,
            run_id=run_id,
            timeout_ms=timeout_ms,
        )
        if not as_json:
            console.print(
                Text.assemble(
                    "run ",
                    (receipt.run_id, "bold"),
                    f": {publication.package} / {workflow} "
                    f"(generation {publication.generation}, admission {receipt.status})",
                )
            )
        tasks = PublishedTasks(rt, {publication.package: folder})
        executor = _executor(
            ctx, rt, tasks, log_dir=log_dir, ttl_ms=ttl_ms, kill_after_ms=kill_after_ms
        )
        progress = RunProgress(console, receipt.run_id, enabled=not as_json)
        driver = Driver(
            rt,
            executor,
            worker_id=_default_worker_id(),
            workers=workers,
            interval_ms=interval_ms,
            ttl_ms=ttl_ms,
            until_run=receipt.run_id,
            on_progress=progress.update,
        )

        def on_signal(_signum: int) -> None:
            if not driver.cancel.is_set():
                progress.notice(
                    f"qlflow: cancelling run {receipt.run_id} (reason user); waiting for "
                    "running steps to stop. Press Ctrl-C again to exit without waiting."
                )
                driver.request_cancel()
            else:
                driver.request_abort()

        try:
            with SignalRelay(on_signal), progress:
                result = driver.run()
        finally:
            executor.close()
        code = _report_run(console, rt, result, as_json)
    raise typer.Exit(code)


def _check_workflow(folder: Path, workflow: str) -> None:
    """Refuse an unknown or disabled workflow before anything is written."""
    from qlflow.packages import load_package

    package = load_package(folder)
    keys = [w.key for w in package.manifest.workflows]
    if workflow not in keys:
        known = ", ".join(keys) or "none"
        raise CliError(
            f"package {package.manifest.package.name!r} has no workflow {workflow!r} "
            f"(workflows: {known})"
        )


def _report_run(console, rt, result: DriveResult, as_json: bool) -> int:
    run = result.run
    if result.aborted:
        _report_abort(rt, result)
        if as_json:
            render.write_json({"run": run, "aborted": True})
        return EXIT_INTERRUPTED
    if as_json:
        render.write_json(run)
    else:
        console.print(render.run_document(run))
        if run.status != "succeeded":
            console.print(f"run {run.run_id} {run.status}" + _run_reason(run))
    return RUN_EXIT_CODES.get(run.status, EXIT_FAILED)


def _run_reason(run) -> str:
    if run.status == "failed":
        failed = [s.step_key for s in run.steps.values() if s.status == "failed"]
        skipped = [s.step_key for s in run.steps.values() if s.status == "skipped"]
        text = f": failed {', '.join(failed) or '-'}"
        return text + (f"; skipped {', '.join(skipped)}" if skipped else "")
    if run.cancel_reason:
        return f" ({run.cancel_reason})"
    return ""


def _report_abort(rt, result: DriveResult) -> None:
    err = render.stderr_console()
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
            if step.status in ("running", "lost", "ready", "pending"):
                attempt = step.attempts[-1] if step.attempts else None
                lease = (
                    f", lease held by {attempt.worker_id} until {render.at(attempt.expires_at_ms)}"
                    if attempt and attempt.expires_at_ms
                    else ""
                )
                err.print(f"    {step.step_key}: {step.status}{lease}")
        err.print(f"  a later cycle settles it (qlflow cycle); see qlflow why {run.run_id}")


# -- cancel / cycle ------------------------------------------------------------------------


@app.command(
    epilog="Example: [bold]qlflow cancel run:0b1c... --reason user[/bold]  (records the "
    "intent; the next cycle converges the Run, running steps are told to stop)"
)
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id.")],
    reason: Annotated[
        str, typer.Option(help="user | policy | shutdown | reconcile | timeout")
    ] = "user",
    json_out: JsonOption = False,
) -> None:
    """Record a Run's cancel intent (idempotent); a cycle converges it."""
    with opened(ctx) as rt:
        view = rt.get_run(run_id)
        recorded = False if view.terminal else rt.cancel(run_id, reason=reason)
        view = rt.get_run(run_id)
    if _wants_json(ctx, json_out):
        render.write_json(
            {
                "run_id": run_id,
                "recorded": recorded,
                "status": view.status,
                "cancel_reason": view.cancel_reason,
            }
        )
        return
    console = _console()
    if view.terminal and not recorded:
        console.print(f"run {run_id} is already {view.status}; nothing to cancel")
    elif recorded:
        console.print(
            f"cancel intent recorded for run {run_id} (reason {reason}); the next cycle "
            "converges it"
        )
    else:
        console.print(f"run {run_id} already has cancel intent (reason {view.cancel_reason})")


@app.command(
    epilog="Example: [bold]qlflow cycle[/bold]  (a host runs this on its own cadence; "
    "[bold]qlflow serve[/bold] does it in a loop)"
)
def cycle(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """Run one bounded cycle: recovery, cancellation, frontier, attempt admission."""
    with opened(ctx) as rt:
        result = rt.cycle()
    if _wants_json(ctx, json_out):
        render.write_json(render.cycle_document(result))
    else:
        _console().print(render.cycle_table(result))


# -- worker / serve -----------------------------------------------------------------------


def _host(
    ctx: typer.Context,
    *,
    cycles: bool,
    worker_id: str | None,
    slots: int,
    interval_ms: int,
    ttl_ms: int,
    kill_after_ms: int,
    drain_ms: int,
    package_dirs: list[Path] | None,
    tasks: list[str] | None,
    once: bool,
    log_dir: Path | None,
) -> None:
    _positive("--interval-ms", interval_ms)
    _positive("--kill-after-ms", kill_after_ms, 0)
    _positive("--drain-ms", drain_ms, 0)
    _check_ttl(ttl_ms)
    folders = [_package_folder(p) for p in package_dirs or []]
    err = render.stderr_console()
    if not folders:
        if not cycles:
            raise CliError(
                "a worker needs --package-dir: the folder of each package whose Tasks it runs"
            )
        err.print("qlflow: serve without --package-dir only cycles; workers run nothing here")
    with opened(ctx) as rt:
        published = PublishedTasks(rt)
        for folder in folders:
            published.add_folder(folder)
        executor = _executor(
            ctx, rt, published, log_dir=log_dir, ttl_ms=ttl_ms, kill_after_ms=kill_after_ms
        )
        driver = Driver(
            rt,
            executor,
            worker_id=worker_id or _default_worker_id(),
            workers=slots,
            interval_ms=interval_ms,
            ttl_ms=ttl_ms,
            cycles=cycles,
            tasks=_split_list(tasks),
            servable=published.task_refs,
            once=once,
            drain_s=drain_ms / 1000,
        )

        def on_signal(signum: int) -> None:
            if not driver.stop.is_set():
                err.print(
                    f"qlflow: {signal.Signals(signum).name}: stopping; running steps get "
                    f"{drain_ms} ms to finish. Signal again to exit at once."
                )
                driver.request_stop()
            else:
                driver.request_abort()

        try:
            with SignalRelay(on_signal):
                result = driver.run()
        finally:
            executor.close()
    for report in result.reports:
        log.info(
            "attempt %s (%s/%s): %s, exit %s",
            report.attempt_id,
            report.run_id,
            report.step_key,
            report.recorded_status,
            report.exit_code,
        )
    if result.aborted:
        for process in result.left_running:
            err.print(
                f"qlflow: killed step {process.step_key} of run {process.run_id} "
                f"(pid {process.pid}); a later cycle records it lost"
            )
        raise typer.Exit(EXIT_INTERRUPTED)
    if once:
        _console().print(f"{len(result.reports)} attempt(s) run")


PackageDirOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--package-dir",
        help="Package folder whose Tasks this host runs (repeatable).",
    ),
]
# options `worker` and `serve` share
DrainOption = Annotated[int, typer.Option(help="On SIGTERM, time running steps get to finish.")]
KillAfterOption = Annotated[int, typer.Option(help="SIGKILL this long after SIGTERM.")]
LogDirOption = Annotated[Path | None, typer.Option(help="Where step logs go.")]


@app.command(
    epilog=(
        "Example: [bold]qlflow worker --package-dir examples/nightly --limit 4[/bold]\n\n"
        "Leases claimed Attempts (another process runs the cycles: [bold]qlflow serve"
        "[/bold] or [bold]qlflow cycle[/bold]), runs each in its package folder, renews "
        "its lease every TTL/3 and records the outcome. SIGTERM or Ctrl-C stops leasing; "
        "running steps get --drain-ms to finish, then SIGTERM and SIGKILL."
    )
)
def worker(
    ctx: typer.Context,
    worker_id: Annotated[
        str | None, typer.Option("--id", help="Worker id (default host-pid).")
    ] = None,
    limit: Annotated[int, typer.Option(help="Attempts run at once.")] = 1,
    ttl_ms: Annotated[int, typer.Option(help="Lease TTL; renewed every TTL/3.")] = 30_000,
    once: Annotated[
        bool, typer.Option("--once", help="One lease pass: run what it got, then exit.")
    ] = False,
    tasks: Annotated[
        list[str] | None,
        typer.Option(help="Only these task refs (package@generation#task, comma separated)."),
    ] = None,
    package_dir: PackageDirOption = None,
    interval_ms: Annotated[
        int, typer.Option(help="Lease poll interval.")
    ] = DEFAULT_SERVE_INTERVAL_MS,
    drain_ms: DrainOption = 10_000,
    kill_after_ms: KillAfterOption = int(DEFAULT_KILL_AFTER_S * 1000),
    log_dir: LogDirOption = None,
) -> None:
    """Run leased Attempts as local processes (no cycles: a separate worker)."""
    _positive("--limit", limit)
    _host(
        ctx,
        cycles=False,
        worker_id=worker_id,
        slots=limit,
        interval_ms=interval_ms,
        ttl_ms=ttl_ms,
        kill_after_ms=kill_after_ms,
        drain_ms=drain_ms,
        package_dirs=package_dir,
        tasks=tasks,
        once=once,
        log_dir=log_dir,
    )


@app.command(
    epilog=(
        "Example: [bold]qlflow serve --package-dir examples/nightly --interval-ms 500 "
        "--workers 4[/bold]\n\n"
        "A host-less deployment: every interval one cycle, then local workers lease and "
        "run what it admitted. SIGTERM (or Ctrl-C) stops leasing, gives running steps "
        "--drain-ms to finish, then SIGTERM and SIGKILL after --kill-after-ms, and exits 0."
    )
)
def serve(
    ctx: typer.Context,
    interval_ms: Annotated[
        int, typer.Option(help="Cycle interval (a finished step wakes it early).")
    ] = DEFAULT_SERVE_INTERVAL_MS,
    workers: Annotated[int, typer.Option(help="Attempts run at once.")] = 4,
    worker_id: Annotated[str | None, typer.Option("--id", help="Worker id.")] = None,
    ttl_ms: Annotated[int, typer.Option(help="Lease TTL; renewed every TTL/3.")] = 30_000,
    package_dir: PackageDirOption = None,
    drain_ms: DrainOption = 10_000,
    kill_after_ms: KillAfterOption = int(DEFAULT_KILL_AFTER_S * 1000),
    log_dir: LogDirOption = None,
) -> None:
    """Cycles plus local workers in a loop, until SIGTERM."""
    _positive("--workers", workers)
    _host(
        ctx,
        cycles=True,
        worker_id=worker_id,
        slots=workers,
        interval_ms=interval_ms,
        ttl_ms=ttl_ms,
        kill_after_ms=kill_after_ms,
        drain_ms=drain_ms,
        package_dirs=package_dir,
        tasks=None,
        once=False,
        log_dir=log_dir,
    )


# -- read commands --------------------------------------------------------------------------


@app.command(epilog="Example: [bold]qlflow runs --status running --json[/bold]")
def runs(
    ctx: typer.Context,
    status: Annotated[
        str | None,
        typer.Option(help="Only Runs with this status (running, succeeded, failed, ...)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    json_out: JsonOption = False,
) -> None:
    """List Runs, newest first."""
    _positive("--limit", limit)
    with opened(ctx) as rt:
        found = rt.runs(status=status, limit=limit)
    if _wants_json(ctx, json_out):
        render.write_json([_without_steps(r) for r in found])
    else:
        _console().print(render.runs_table(found))


def _without_steps(run) -> dict[str, Any]:
    document = render.jsonable(run)
    document.pop("steps", None)
    return document


@app.command(
    epilog="Example: [bold]qlflow show run:0b1c...[/bold], or [bold]qlflow show run:0b1c... "
    "--at 3[/bold] for the state right after the Run's event at version 3"
)
def show(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id.")],
    at_version: Annotated[
        int | None,
        typer.Option("--at", metavar="VERSION", help="The state at this Run version."),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Show a Run with its steps as a table (now, or at any version)."""
    _positive("--at", at_version)
    as_json = _wants_json(ctx, json_out)
    with opened(ctx) as rt:
        if at_version is None:
            view = rt.get_run(run_id)
            if as_json:
                render.write_json(view)
            else:
                _console().print(render.run_document(view))
            return
        state = render.view_of_aggregate(rt.aggregate_at(run_id, at_version))
    if as_json:
        render.write_json(state)
    else:
        console = _console()
        console.print(Text(f"run {run_id} as of version {at_version}", style="bold"))
        console.print(render.run_document(state))


@app.command(
    epilog=(
        "Examples: [bold]qlflow events --run run:0b1c...[/bold]; "
        "[bold]qlflow events --type attempt.failed --type attempt.lost --since-ms "
        "1714550000000[/bold]; [bold]qlflow events --follow --json[/bold] (JSON lines until "
        "Ctrl-C)"
    )
)
def events(
    ctx: typer.Context,
    run_id: Annotated[str | None, typer.Option("--run", metavar="RUN", help="One Run.")] = None,
    types: Annotated[
        list[str] | None,
        typer.Option("--type", help="Event type (repeatable or comma separated)."),
    ] = None,
    since_ms: Annotated[int | None, typer.Option(help="At or after this time (epoch ms).")] = None,
    until_ms: Annotated[int | None, typer.Option(help="Before this time (epoch ms).")] = None,
    after: Annotated[int, typer.Option(metavar="POSITION", help="After this global position.")] = 0,
    limit: Annotated[int | None, typer.Option(help="At most this many.")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    interval_ms: Annotated[int, typer.Option(help="Poll interval of --follow.")] = 500,
    json_out: JsonOption = False,
) -> None:
    """Events of the log, filtered by Run, type, time and position."""
    _positive("--limit", limit)
    _positive("--after", after, 0)
    _positive("--interval-ms", interval_ms)
    as_json = _wants_json(ctx, json_out)
    wanted = _split_list(types)
    with opened(ctx) as rt:

        def fetch(position: int, how_many: int | None):
            return rt.events(
                run_id,
                types=wanted,
                since_ms=since_ms,
                until_ms=until_ms,
                after_position=position,
                limit=how_many,
            )

        if run_id is not None:
            rt.get_run(run_id)  # NotFound says so, instead of an empty list
        found = fetch(after, limit)
        if not follow:
            if as_json:
                render.write_json(found)
            else:
                _console().print(render.events_table(found))
            return
        _follow(fetch, found, after, as_json, interval_ms / 1000)


def _follow(fetch, first, after: int, as_json: bool, interval_s: float) -> None:
    console = _console()
    stop = threading.Event()

    def emit(records) -> int:
        position = after
        for record in records:
            if as_json:
                render.write_json(record, pretty=False)
            else:
                console.print("  ".join(render.event_row(record)), soft_wrap=True)
            position = record.global_position
        return position

    with SignalRelay(lambda _signum: stop.set()):
        position = max(after, emit(first))
        while not stop.wait(interval_s):
            records = fetch(position, 1000)
            if records:
                position = max(position, emit(records))


@app.command(
    epilog="Example: [bold]qlflow why run:0b1c...[/bold]  (which Attempt blocks it, which "
    "lease, held by whom, until when)"
)
def why(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id.")],
    json_out: JsonOption = False,
) -> None:
    """Say why a Run is not terminal (or how it ended)."""
    with opened(ctx) as rt:
        report = rt.why(run_id)
    if _wants_json(ctx, json_out):
        render.write_json(report.to_dict())
    else:
        console = _console()
        for line in report.lines():
            console.print(line, soft_wrap=True)


@app.command(
    epilog="Example: [bold]qlflow rebuild[/bold]  (replays the whole log into fresh read "
    "models and swaps them in atomically)"
)
def rebuild(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """Rebuild every read model from the event log."""
    as_json = _wants_json(ctx, json_out)
    with opened(ctx) as rt, _replay_progress("rebuilding", enabled=not as_json) as progress:
        summary = rt.rebuild_projections(progress)
    if as_json:
        render.write_json(summary.to_dict())
    else:
        _console().print(render.rebuild_table(summary))


@contextlib.contextmanager
def _replay_progress(what: str, *, enabled: bool):
    """A progress bar for a replay of the log, on a terminal; None elsewhere."""
    console = render.stderr_console()
    if not (enabled and console.is_terminal):
        yield None
        return
    with Progress(
        TextColumn(what), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@app.command(
    epilog="Example: [bold]qlflow verify[/bold]  (exit 0 when every read model equals a "
    "replay of the log, 1 otherwise, listing the differences)"
)
def verify(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """Check that every read model equals a fresh replay of the log."""
    as_json = _wants_json(ctx, json_out)
    with opened(ctx) as rt, _replay_progress("verifying", enabled=not as_json) as progress:
        report = rt.verify_projections(progress)
    if as_json:
        render.write_json(report.to_dict())
    else:
        console = _console()
        for line in report.lines():
            console.print(line, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command(
    "pg-roles",
    epilog="Example: [bold]qlflow --db postgresql://postgres@db/app pg-roles --schema qlflow "
    "--prefix qlflow[/bold]  (then run every replica and worker with the runtime URL)",
)
def pg_roles_command(
    ctx: typer.Context,
    schema: Annotated[str, typer.Option(help="The schema that holds qlflow's tables.")] = "qlflow",
    prefix: Annotated[
        str,
        typer.Option(help="Roles are <prefix>_owner, _runtime, _publisher, _audit, _admission."),
    ] = "qlflow",
    json_out: JsonOption = False,
) -> None:
    """Create or repair least-privilege PostgreSQL roles (--db connects as a superuser)."""
    import eventstore
    import qlflow
    from actors import roles

    url = _settings(ctx).url
    if not url.startswith(("postgresql://", "postgres://")):
        raise CliError("pg-roles needs a PostgreSQL --db URL that connects as a superuser")
    try:
        urls = roles.setup_roles(
            url, schema, prefix, migrate=lambda owner_url: qlflow.open(owner_url).close()
        )
    except QlflowError as error:
        raise CliError(str(error)) from None
    except eventstore.driver_errors() as error:
        raise CliError(f"--db {redact(url)}: {str(error).strip().splitlines()[0]}") from None
    by_kind = {
        "owner": urls.owner,
        "runtime": urls.runtime,
        "publisher": urls.publisher,
        "audit": urls.audit,
    }
    if _wants_json(ctx, json_out):
        render.write_json({"schema": urls.schema, "roles": dict(urls.roles), "urls": by_kind})
        return
    console = _console()
    for kind, role_url in by_kind.items():
        console.print(f"{kind:<10} {redact(role_url)}", soft_wrap=True)


# -- entry point ---------------------------------------------------------------------------


def _error_line(message: str) -> None:
    text = " ".join(str(message).split())
    sys.stderr.write(f"qlflow: error: {text}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the command line and exit with its status."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="qlflow", standalone_mode=False)
    except typer.Abort:
        _error_line("interrupted")
        code = EXIT_INTERRUPTED
    except typer.TyperException as error:  # usage errors: typer's own click exceptions
        if type(error).__name__ == "NoArgsIsHelpError":
            error.show()
        else:
            message = error.format_message() if hasattr(error, "format_message") else str(error)
            _error_line(f"{message} (see --help)")
        code = getattr(error, "exit_code", EXIT_BAD_INPUT)
    except CliError as error:
        _error_line(str(error))
        code = error.exit_code
    except (CorruptionError, CycleFailing) as error:
        _error_line(str(error))
        code = EXIT_FAILED
    except NotFound as error:
        _error_line(str(error))
        code = EXIT_BAD_INPUT
    except QlflowError as error:
        _error_line(str(error))
        code = EXIT_BAD_INPUT
    except OSError as error:
        where = f": {error.filename}" if error.filename else ""
        _error_line(f"{error.strerror or error}{where}")
        code = EXIT_BAD_INPUT
    except KeyboardInterrupt:
        _error_line("interrupted")
        code = EXIT_INTERRUPTED
    except Exception as error:
        if _verbosity >= 2:
            traceback.print_exc()
        _error_line(
            f"internal error: {type(error).__name__}: {error} "
            "(rerun with -vv for the traceback, and please report it)"
        )
        code = EXIT_FAILED
    sys.exit(code if isinstance(code, int) else EXIT_OK)


if __name__ == "__main__":
    main()
