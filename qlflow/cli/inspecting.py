"""Inspecting commands: `runs` (searched, newest first, with short ids), `show` (now
or at any version), `events` (newest first, filtered, or followed as they commit)
and `why` (what keeps a Run from ending, or how it ended). Every Run argument takes
a unique prefix of the id."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from domain import event_types
from domain.records import Record
from projections.views import RunView, view_of_aggregate
from qlflow import archive as archiving
from qlflow.cli.app import INSPECT, JsonOption, app, wants_json
from qlflow.cli.exits import EXIT_UNAVAILABLE, CliError
from qlflow.cli.opening import opened
from qlflow.cli.options import at_least, split_list
from qlflow.cli.output import jsonable, stderr_console, stdout_console, write_json
from qlflow.cli.run_report import failed_lines
from qlflow.cli.signals import SignalRelay
from qlflow.cli.tables import event_row, events_table, run_document, runs_table
from qlflow.cli.times import TIME_HELP, optional_time, teller
from qlflow.clock import wall_clock_ms
from qlflow.transient import Backoff, transient_errors

Fetch = Callable[[int, int | None], list[Record]]
DEFAULT_EVENTS = 50
MAX_FOLLOW_PAUSE_S = 10.0  # the longest pause of --follow while the store is unavailable
RunArgument = Annotated[
    str,
    typer.Argument(metavar="RUN", help="Run id, or any unique prefix (run: may be left out)."),
]


ArchiveOption = Annotated[
    Path | None,
    typer.Option(
        "--archive",
        metavar="FILE",
        help="Read a Run retention removed from this archive (qlflow retain --archive).",
    ),
]


def error_line_soft(message: str) -> None:
    """A notice of --follow on stderr (stdout carries only events)."""
    sys.stderr.write(f"qlflow: events --follow: {message}\n")
    sys.stderr.flush()


@app.command(
    rich_help_panel=INSPECT,
    epilog="Examples: [bold]qlflow runs --status failed --since 1d[/bold]; "
    "[bold]qlflow runs --package backup --workflow nightly --limit 5[/bold]",
)
def runs(
    ctx: typer.Context,
    package: Annotated[str | None, typer.Option(help="Only Runs of this package.")] = None,
    workflow: Annotated[str | None, typer.Option(help="Only Runs of this workflow.")] = None,
    status: Annotated[
        str | None,
        typer.Option(help="Only Runs with this status (running, succeeded, failed, ...)."),
    ] = None,
    since: Annotated[
        str | None, typer.Option(metavar="TIME", help=f"Admitted at or after: {TIME_HELP}.")
    ] = None,
    until: Annotated[
        str | None, typer.Option(metavar="TIME", help=f"Admitted before: {TIME_HELP}.")
    ] = None,
    rerun_of: Annotated[
        str | None,
        typer.Option("--rerun-of", metavar="RUN", help="Only the Runs that rerun this Run."),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    json_out: JsonOption = False,
) -> None:
    """List Runs, newest first: a short id for each that `show`, `why`, `logs` and
    `cancel` take."""
    at_least("--limit", limit)
    now = wall_clock_ms()
    with opened(ctx, read_only=True) as rt:
        source = rt.resolve_run_id(rerun_of) if rerun_of is not None else None
        found = rt.runs(
            status,
            limit + 1,
            package=package,
            workflow=workflow,
            since_ms=optional_time("--since", since, now),
            until_ms=optional_time("--until", until, now),
            rerun_of=source,
        )
        more, found = len(found) > limit, found[:limit]
        shorts = rt.short_run_ids([r.run_id for r in found])
    if wants_json(ctx, json_out):
        write_json([{**_without_steps(r), "short_id": shorts[r.run_id]} for r in found])
    else:
        stdout_console().print(runs_table(found, shorts, now, more=more))


_RERUNS_SHOWN = 20  # `show` names at most this many Runs that rerun the one shown


def _without_steps(run: RunView) -> dict[str, Any]:
    document: dict[str, Any] = jsonable(run)
    document.pop("steps", None)
    return document


@app.command(
    rich_help_panel=INSPECT,
    epilog="Example: [bold]qlflow show 0b1c2d3e[/bold] (any unique prefix of the run id), or "
    "[bold]qlflow show 0b1c2d3e --at 3[/bold] for the state right after the Run's event at "
    "version 3",
)
def show(
    ctx: typer.Context,
    run_id: RunArgument,
    at_version: Annotated[
        int | None,
        typer.Option("--at", metavar="VERSION", help="The state at this Run version."),
    ] = None,
    archive: ArchiveOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show a Run with its steps as a table (now, or at any version), and the last lines
    of each failed step's log."""
    at_least("--at", at_version)
    as_json = wants_json(ctx, json_out)
    if archive is not None:
        archived = archiving.resolve_archived_run(archive, run_id)
        shown = view_of_aggregate(archiving.archived_aggregate(archive, archived))
        if as_json:
            write_json(shown)
        else:
            console = stdout_console()
            console.print(Text(f"run {archived} from the archive {archive}", style="bold"))
            console.print(run_document(shown))
        return
    with opened(ctx, read_only=True) as rt:
        run_id = rt.resolve_run_id(run_id)
        if at_version is None:
            view = rt.get_run(run_id)
            rerun_as = [r.run_id for r in rt.runs(limit=_RERUNS_SHOWN, rerun_of=run_id)]
            if as_json:
                write_json({**jsonable(view), "rerun_as": rerun_as})
            else:
                document = run_document(view, last_lines=failed_lines(rt, view), rerun_as=rerun_as)
                stdout_console().print(document)
            return
        state = view_of_aggregate(rt.aggregate_at(run_id, at_version))
    if as_json:
        write_json(state)
    else:
        console = stdout_console()
        console.print(Text(f"run {run_id} as of version {at_version}", style="bold"))
        console.print(run_document(state))


@app.command(
    rich_help_panel=INSPECT,
    epilog=(
        "Examples: [bold]qlflow events 0b1c2d3e[/bold] (one Run's); "
        "[bold]qlflow events --type attempt.failed --type attempt.lost --since 2h[/bold]; "
        "[bold]qlflow events --follow --json[/bold] (JSON lines until Ctrl-C)"
    ),
)
def events(
    ctx: typer.Context,
    run: Annotated[
        str | None,
        typer.Argument(metavar="[RUN]", help="One Run (id or unique prefix): the same as --run."),
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run", metavar="RUN", help="One Run (id or unique prefix).")
    ] = None,
    types: Annotated[
        list[str] | None,
        typer.Option("--type", help="Event type (repeatable or comma separated)."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", "--since-ms", metavar="TIME", help=f"At or after: {TIME_HELP}."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", "--until-ms", metavar="TIME", help=f"Before: {TIME_HELP}."),
    ] = None,
    after: Annotated[int, typer.Option(metavar="POSITION", help="After this global position.")] = 0,
    before: Annotated[
        int | None, typer.Option(metavar="POSITION", help="Before this global position.")
    ] = None,
    limit: Annotated[
        int, typer.Option(help="At most this many (the newest ones).")
    ] = DEFAULT_EVENTS,
    every: Annotated[bool, typer.Option("--all", help="Every matching event: no limit.")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    interval_ms: Annotated[int, typer.Option(help="Poll interval of --follow.")] = 500,
    archive: ArchiveOption = None,
    json_out: JsonOption = False,
) -> None:
    """Events of the log, newest first, filtered by Run, type, time and position."""
    if run is not None:
        if run_id is not None and run_id != run:
            raise CliError(f"two Runs given: {run!r} and --run {run_id!r}; give one")
        run_id = run
    at_least("--limit", limit)
    at_least("--after", after, 0)
    at_least("--before", before)
    at_least("--interval-ms", interval_ms)
    as_json = wants_json(ctx, json_out)
    if archive is not None:
        if run_id is None:
            raise CliError("--archive reads one Run's events: give the Run (RUN or --run RUN)")
        archived = archiving.resolve_archived_run(archive, run_id)
        records = archiving.archived_records(archive, archived)[::-1]
        shown = records if every else records[:limit]
        if as_json:
            write_json(shown)
        else:
            more = len(records) > len(shown)
            stdout_console().print(events_table(shown, wall_clock_ms(), more=more))
        return
    wanted = _known_types(split_list(types))
    now = wall_clock_ms()
    since_ms, until_ms = optional_time("--since", since, now), optional_time("--until", until, now)
    with opened(ctx, read_only=True) as rt:
        if run_id is not None:
            run_id = rt.resolve_run_id(run_id)

        def fetch(position: int, how_many: int | None) -> list[Record]:
            return rt.events(
                run_id,
                types=wanted,
                since_ms=since_ms,
                until_ms=until_ms,
                after_position=position,
                limit=how_many,
            )

        newest = rt.events(
            run_id,
            types=wanted,
            since_ms=since_ms,
            until_ms=until_ms,
            after_position=after,
            before_position=before,
            limit=None if every else limit + 1,
            newest_first=True,
        )
        more = not every and len(newest) > limit
        found = newest if every else newest[:limit]
        if not follow:
            if as_json:
                write_json(found)
            else:
                stdout_console().print(events_table(found, now, more=more))
            return
        # follow from the newest shown, or from now when nothing matched yet
        start = found[0].global_position if found else max(after, rt.store.head_position())
        _follow(fetch, found[::-1], start, as_json, interval_ms / 1000)


def _known_types(types: list[str] | None) -> list[str] | None:
    """The types asked for, each one the log can hold (else a clear error)."""
    known = event_types.known()
    unknown = [t for t in types or () if t not in known]
    if unknown:
        raise CliError(
            f"unknown event type(s) {', '.join(unknown)}; the log holds: {', '.join(known)}"
        )
    return types


def _follow(
    fetch: Fetch, first: Sequence[Record], after: int, as_json: bool, interval_s: float
) -> None:
    """Print `first` (oldest first), then every new event each `interval_s`, until
    SIGINT / SIGTERM."""
    console = stdout_console()
    stop = threading.Event()

    def emit(records: Sequence[Record]) -> int:
        position = after
        for record in records:
            if as_json:
                write_json(record, pretty=False)
            else:
                console.print("  ".join(event_row(record, wall_clock_ms())), soft_wrap=True)
            position = record.global_position
        return position

    backoff = Backoff(first_s=interval_s, cap_s=max(interval_s, MAX_FOLLOW_PAUSE_S))
    with SignalRelay(lambda _signum: stop.set()):
        position = max(after, emit(first))
        pause = interval_s
        while not stop.wait(pause):
            pause = interval_s
            try:
                records = fetch(position, 1000)
            except transient_errors() as error:
                # a dropped connection is made again on the next try; the events
                # printed so far are not printed twice (it resumes after `position`)
                pause = backoff.failed()
                if backoff.should_log():
                    error_line_soft(f"the store is unavailable, retrying: {error}")
                continue
            if backoff.succeeded():
                error_line_soft(f"the store answers again; resuming after position {position}")
            if records:
                position = max(position, emit(records))


@app.command(
    rich_help_panel=INSPECT,
    epilog="Example: [bold]qlflow why 0b1c2d3e[/bold]  (which Attempt blocks it, which "
    "lease, held by whom, until when; or how it ended, with every failed step and the "
    "last lines of its log)",
)
def why(
    ctx: typer.Context,
    run_id: RunArgument,
    lines: Annotated[int, typer.Option(help="Log lines shown per failed step.")] = 10,
    json_out: JsonOption = False,
) -> None:
    """Say why a Run is not terminal (or how it ended), naming every step that failed,
    timed out or was lost, with the last lines of its log."""
    at_least("--lines", lines, 0)
    now = wall_clock_ms()
    with opened(ctx, read_only=True) as rt:
        report = rt.why(rt.resolve_run_id(run_id), now_ms=now, log_lines=lines)
    if wants_json(ctx, json_out):
        write_json(report.to_dict())
    else:
        console = stdout_console()
        for line in report.lines(teller(now)):
            console.print(line, soft_wrap=True)


@app.command(
    rich_help_panel=INSPECT,
    epilog="Example: [bold]qlflow ui[/bold], then open the address it prints; "
    "[bold]qlflow ui --host 0.0.0.0[/bold] to serve other machines (prints a token)",
)
def ui(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to bind; anything but loopback needs the token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8321,
    token: Annotated[
        str | None,
        typer.Option(help="Access token (generated and printed when bound off loopback)."),
    ] = None,
) -> None:
    """Serve the web dashboard (runs, a Run's DAG, timeline, why; cancel and start)."""
    at_least("--port", port)
    try:
        from qlflow import ui as dashboard
    except ImportError as error:  # the ui extra is not installed
        raise CliError(
            f"the dashboard needs the ui extra: pip install 'qlflow[ui]' ({error})"
        ) from None
    with opened(ctx, read_only=True):
        pass  # a missing, foreign, older or newer store is refused here, untouched
    try:
        with opened(ctx) as rt:  # the dashboard's actions (cancel, start) write
            dashboard.serve(rt, host=host, port=port, token=token)
    except CliError as error:
        if error.exit_code != EXIT_UNAVAILABLE:
            raise
        stderr_console().print(f"qlflow ui: pages only, actions are refused: {error}")
        with opened(ctx, read_only=True) as rt:
            dashboard.serve(rt, host=host, port=port, token=token)
