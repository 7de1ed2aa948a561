"""Running commands: `start` (admit a Run), `run` (publish, start and drive it to
its end), `cancel` (record cancel intent) and `cycle` (one bounded pass)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from domain.params import param_texts
from domain.transitions import CANCEL_REASONS
from domain.values import CREATED
from qlflow.cli.app import RUN_AND_HOST, JsonOption, app, wants_json
from qlflow.cli.executors import default_worker_id, local_executor
from qlflow.cli.exits import CliError
from qlflow.cli.opening import opened
from qlflow.cli.options import TtlOption, at_least, check_ttl, package_folder
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.progress import RunProgress
from qlflow.cli.run_report import report_run
from qlflow.cli.signals import SignalRelay
from qlflow.cli.tables import cycle_document, cycle_table, receipt_table
from qlflow.driver import DEFAULT_RUN_INTERVAL_MS, Driver
from qlflow.executor import DEFAULT_KILL_AFTER_S, PublishedTasks

ParamOption = Annotated[
    list[str] | None,
    typer.Option(
        "--param",
        "-p",
        metavar="NAME=VALUE",
        help="A Workflow parameter as name=value (repeatable); typed as the manifest declares.",
    ),
]


@app.command(
    rich_help_panel=RUN_AND_HOST,
    epilog="Example: [bold]qlflow start backup nightly --admission-key nightly-2024-05-01"
    "[/bold]  (the same key again returns the same Run; a host must drive it: "
    "[bold]qlflow serve[/bold])",
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
    param: ParamOption = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "-P",
            "--priority",
            help="-1000..1000: workers lease a higher priority's steps first "
            "(default: the Workflow's priority, else 0).",
        ),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Admit a Workflow Run of the package's current publication (no host needed)."""
    at_least("--timeout-ms", timeout_ms)
    params = param_texts(param or [])
    with opened(ctx) as rt:
        receipt = rt.start(
            package,
            workflow,
            admission_key=admission_key,
            run_id=run_id,
            timeout_ms=timeout_ms,
            params=params,
            priority=priority,
        )
    if wants_json(ctx, json_out):
        write_json(receipt)
    else:
        console = stdout_console()
        console.print(receipt_table(receipt))
        console.print(
            "nothing runs until a host drives it: qlflow serve --package-dir FOLDER "
            "(or qlflow cycle with qlflow worker --package-dir FOLDER)"
        )


@app.command(
    rich_help_panel=RUN_AND_HOST,
    epilog=(
        "Example: [bold]qlflow run examples/nightly nightly[/bold]\n\n"
        "Ctrl-C records a cancel intent (reason user) and keeps converging until the Run "
        "is terminal: running steps get SIGTERM, then SIGKILL after --kill-after-ms. "
        "A second Ctrl-C exits at once and says what is left.\n\n"
        "Exit status: 0 succeeded, 1 failed, 3 cancelled, 4 timed out, 2 bad input, "
        "130 interrupted without waiting."
    ),
)
def run(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Package folder (or its qlflow.toml).")],
    workflow: Annotated[str, typer.Argument(help="Workflow key to run.")],
    workers: Annotated[int, typer.Option(help="Steps run at once.")] = 4,
    interval_ms: Annotated[
        int, typer.Option(help="Cycle interval while waiting (a finished step wakes it).")
    ] = DEFAULT_RUN_INTERVAL_MS,
    ttl_ms: TtlOption = 30_000,
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
    param: ParamOption = None,
    json_out: JsonOption = False,
) -> None:
    """Publish, start and drive a Workflow until its Run is terminal, with live progress."""
    at_least("--workers", workers)
    at_least("--interval-ms", interval_ms)
    at_least("--timeout-ms", timeout_ms)
    check_ttl(ttl_ms)
    at_least("--kill-after-ms", kill_after_ms, 0)
    params = param_texts(param or [])
    folder = package_folder(path)
    _check_workflow(folder, workflow)
    as_json = wants_json(ctx, json_out)
    console = stdout_console()
    with opened(ctx) as rt:
        publication = rt.publish(folder)
        receipt = rt.start(
            publication.package,
            workflow,
            admission_key=admission_key,
            run_id=run_id,
            timeout_ms=timeout_ms,
            params=params,
        )
        if not as_json:
            console.print(
                Text.assemble(
                    "run ",
                    (receipt.run_id, "bold"),
                    f": {publication.package} / {workflow}, generation "
                    f"{publication.generation}"
                    + (
                        ", a new run"
                        if receipt.status == CREATED
                        else ", already started before with this admission key"
                    ),
                )
            )
        tasks = PublishedTasks(rt, {publication.package: folder})
        executor = local_executor(
            ctx, rt, tasks, log_dir=log_dir, ttl_ms=ttl_ms, kill_after_ms=kill_after_ms
        )
        progress = RunProgress(console, receipt.run_id, enabled=not as_json)
        driver = Driver(
            rt,
            executor,
            worker_id=default_worker_id(),
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
        code = report_run(console, result, as_json, rt)
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


@app.command(
    rich_help_panel=RUN_AND_HOST,
    epilog="Example: [bold]qlflow cancel run:0b1c... --reason user[/bold]  (records the "
    "intent and ends what no worker holds; running steps are told to stop, and the "
    "Run ends with the last one's completion)",
)
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique prefix).")],
    reason: Annotated[str, typer.Option(help=" | ".join(CANCEL_REASONS))] = "user",
    json_out: JsonOption = False,
) -> None:
    """Cancel a Run (idempotent): what no worker holds ends at once; a step a worker
    holds is asked to stop, and its completion ends the Run."""
    with opened(ctx) as rt:
        run_id = rt.resolve_run_id(run_id)  # the id, or any unique prefix of it
        view = rt.get_run(run_id)
        recorded = False if view.terminal else rt.cancel(run_id, reason=reason)
        view = rt.get_run(run_id)
    if wants_json(ctx, json_out):
        write_json(
            {
                "run_id": run_id,
                "recorded": recorded,
                "status": view.status,
                "cancel_reason": view.cancel_reason,
            }
        )
        return
    console = stdout_console()
    if view.terminal and not recorded:
        console.print(f"run {run_id} is already {view.status}; nothing to cancel")
    elif recorded and view.terminal:
        console.print(f"run {run_id} {view.status} (reason {reason}): no worker held any of it")
    elif recorded:
        console.print(
            f"cancel intent recorded for run {run_id} (reason {reason}); a worker holds a "
            "step of it: the Run ends once that step stops and its completion is recorded"
        )
    else:
        console.print(f"run {run_id} already has cancel intent (reason {view.cancel_reason})")


@app.command(
    rich_help_panel=RUN_AND_HOST,
    epilog="Example: [bold]qlflow cycle[/bold]  (a host runs this on its own cadence; "
    "[bold]qlflow serve[/bold] does it in a loop)",
)
def cycle(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """Run one bounded cycle: recovery, cancellation, frontier, attempt admission."""
    with opened(ctx) as rt:
        result = rt.cycle()
    if wants_json(ctx, json_out):
        write_json(cycle_document(result))
    else:
        stdout_console().print(cycle_table(result))
