"""`qlflow retain`: remove finished Runs, batch by batch, each batch named by a
retention record (docs/DESIGN.md, "Retention")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from actors.retention import RetentionReport
from qlflow.cli.app import ADMINISTER, JsonOption, app, wants_json
from qlflow.cli.executors import default_log_dir
from qlflow.cli.exits import CliError
from qlflow.cli.opening import opened
from qlflow.cli.options import at_least
from qlflow.cli.output import stderr_console, stdout_console, write_json
from qlflow.cli.times import is_duration, parse_duration, parse_time, when
from qlflow.clock import wall_clock_ms
from qlflow.executor.local import remove_local_logs


@app.command(
    rich_help_panel=ADMINISTER,
    epilog="Example: [bold]qlflow retain --finished-before 30d[/bold]  (removes every Run "
    "that finished more than 30 days ago, with its events, rows and logs; "
    "[bold]--dry-run[/bold] says what would go)",
)
def retain(
    ctx: typer.Context,
    finished_before: Annotated[
        str,
        typer.Option(
            metavar="AGE|TIME",
            help="Remove Runs that finished before this: an age (30d, 12h) or a time "
            "(ISO-8601, epoch ms).",
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")
    ] = False,
    batch: Annotated[int, typer.Option(help="Runs removed per transaction.")] = 100,
    archive: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="First write each removed Run's events and logs to this SQLite file "
            "(qlflow export's layout; a new file, or an archive of this store).",
        ),
    ] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option(help="The local step logs to clean too (default: .qlflow-logs by the db)."),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Remove finished Runs with everything that is theirs (events, read-model rows,
    snapshots, stored and local logs); a retention record names each batch."""
    at_least("--batch", batch)
    now = wall_clock_ms()
    cutoff = _cutoff(finished_before, now)
    as_json = wants_json(ctx, json_out)
    err = stderr_console()

    def progress(report: RetentionReport) -> None:
        if not as_json:
            last = report.batches[-1]
            err.print(
                f"batch {len(report.batches)}: {len(last.run_ids)} run(s), {last.events} "
                f"event(s) ({report.runs} so far)",
                soft_wrap=True,
            )

    with opened(ctx, read_only=dry_run) as rt:
        report = rt.retain(
            cutoff,
            batch=batch,
            dry_run=dry_run,
            now_ms=now,
            progress=progress,
            archive=archive,
        )
        if report.runs and not dry_run:
            rt.reclaim()  # the removed Runs' space, reusable now (VACUUM on PostgreSQL)
        folder = log_dir or default_log_dir(rt.url)
    files = 0 if dry_run else remove_local_logs(folder, report.run_ids)
    if as_json:
        write_json({**report.document(), "local_log_folders": files})
        return
    verb = "would remove" if dry_run else "removed"
    stdout_console().print(
        f"{verb} {report.runs} run(s) that finished before {when(cutoff, now)}: "
        f"{report.events} event(s), {report.log_bytes} stored log bytes, in "
        f"{len(report.batches)} batch(es)"
        + ("" if dry_run else f"; {files} local log folder(s) deleted"),
        soft_wrap=True,
    )


def _cutoff(text: str, now: int) -> int:
    """The cutoff an age or a time names; an age of zero (or a negative one) is refused."""
    value = text.strip()
    if is_duration(value) and parse_duration("--finished-before", value) <= 0:
        raise CliError(f"--finished-before must be an age above zero, got {text!r}")
    if value.startswith("-"):
        raise CliError(f"--finished-before must be a positive age or a past time, got {text!r}")
    return parse_time("--finished-before", value, now)
