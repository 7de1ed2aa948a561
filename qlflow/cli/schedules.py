"""`qlflow schedules` lists the schedules of the head publications with their cursors;
`qlflow schedule pause|resume ID` stops and restarts one. `qlflow serve` fires them:
its cycles run the schedule phase (docs/DESIGN.md, "Schedules")."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from zoneinfo import ZoneInfo

import typer
from rich.table import Table
from rich.text import Text

from projections.schedule_views import ScheduleView
from qlflow.cli.app import ADMINISTER, INSPECT, JsonOption, app, wants_json
from qlflow.cli.opening import opened
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.times import TIME_HELP, parse_time, relative, when
from qlflow.clock import wall_clock_ms

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

schedule_app = typer.Typer(
    name="schedule",
    help="Pause or resume one schedule (its id is in [bold]qlflow schedules[/bold]).",
    no_args_is_help=True,
)
app.add_typer(schedule_app, rich_help_panel=ADMINISTER)


@app.command(
    rich_help_panel=INSPECT,
    epilog="Example: [bold]qlflow schedules[/bold]; [bold]qlflow schedules --json[/bold]",
)
def schedules(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """List schedules: Workflow, cron in words, zone, next fire (in the schedule's zone),
    last fire, paused. `qlflow serve` fires them."""
    with opened(ctx, read_only=True) as rt:
        found = rt.schedules()
    if wants_json(ctx, json_out):
        write_json([asdict(view) for view in found])
        return
    console = stdout_console()
    if not found:
        console.print(
            "no schedules: declare schedules = [{ cron = ..., timezone = ... }] on a "
            "Workflow and publish it"
        )
        return
    console.print(schedules_table(found, wall_clock_ms()))


def schedules_table(found: list[ScheduleView], now_ms: int) -> Table:
    """The schedules as a table, times relative to `now_ms`."""
    table = Table(title="schedules", title_justify="left")
    for column in ("workflow", "cron", "zone", "next fire", "last fire", "overlap", "paused", "id"):
        table.add_column(column)
    for view in found:
        table.add_row(
            f"{view.package} {view.workflow}",
            f"{view.description} ({view.cron})" if view.description != view.cron else view.cron,
            view.timezone,
            _next(view, now_ms),
            when(view.last_fired_at_ms, now_ms),
            view.overlap,
            Text("paused", style="yellow") if view.paused else "no",
            view.schedule_id,
        )
    return table


def _next(view: ScheduleView, now_ms: int) -> str:
    if view.paused:
        return "- (paused)"
    if view.next_fire_at_ms is None:
        return "at the next cycle's arming"
    return (
        f"{zoned(view.next_fire_at_ms, view.timezone)} ({relative(view.next_fire_at_ms, now_ms)})"
    )


def zoned(at_ms: int, zone_name: str) -> str:
    """The instant as the schedule's zone shows it: `2024-05-01 03:00 CEST`."""
    at = (_EPOCH + timedelta(milliseconds=at_ms)).astimezone(ZoneInfo(zone_name))
    return at.strftime("%Y-%m-%d %H:%M %Z")


def _changed(ctx: typer.Context, schedule_id: str, paused: bool, json_out: bool) -> None:
    with opened(ctx) as rt:
        changed = rt.pause_schedule(schedule_id) if paused else rt.resume_schedule(schedule_id)
        view = next((v for v in rt.schedules() if v.schedule_id == schedule_id), None)
    document: dict[str, Any] = {"schedule_id": schedule_id, "changed": changed}
    if view is not None:
        document["next_fire_at_ms"] = view.next_fire_at_ms
        document["paused"] = view.paused
    if wants_json(ctx, json_out):
        write_json(document)
        return
    verb = "paused" if paused else "resumed"
    if not changed:
        stdout_console().print(f"schedule {schedule_id} was already {verb}")
        return
    line = f"schedule {schedule_id} {verb}"
    if view is not None and view.next_fire_at_ms is not None:
        line += f"; next fire {zoned(view.next_fire_at_ms, view.timezone)}"
    stdout_console().print(line)


@schedule_app.command(epilog="Example: [bold]qlflow schedule pause sch:57b4…[/bold]")
def pause(
    ctx: typer.Context,
    schedule_id: Annotated[str, typer.Argument(metavar="ID", help="The schedule id.")],
    json_out: JsonOption = False,
) -> None:
    """Stop a schedule's fires until it is resumed."""
    _changed(ctx, schedule_id, True, json_out)


@schedule_app.command(epilog="Example: [bold]qlflow schedule resume sch:57b4…[/bold]")
def resume(
    ctx: typer.Context,
    schedule_id: Annotated[str, typer.Argument(metavar="ID", help="The schedule id.")],
    json_out: JsonOption = False,
) -> None:
    """Fire a paused schedule again from its next occurrence (what it missed is not
    fired)."""
    _changed(ctx, schedule_id, False, json_out)


@schedule_app.command(
    epilog="Examples: [bold]qlflow schedule backfill sch:57b4… --from 2026-11-01 --to "
    "2026-12-01 --dry-run[/bold] (list the occurrences); the same without --dry-run admits "
    "their Runs"
)
def backfill(
    ctx: typer.Context,
    schedule_id: Annotated[str, typer.Argument(metavar="ID", help="The schedule id.")],
    from_time: Annotated[
        str, typer.Option("--from", metavar="TIME", help=f"First instant: {TIME_HELP}.")
    ],
    to_time: Annotated[
        str, typer.Option("--to", metavar="TIME", help=f"End (not included): {TIME_HELP}.")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the occurrences; admit nothing.")
    ] = False,
    max_runs: Annotated[
        int, typer.Option("--max", metavar="N", help="Admit at most N Runs (1..1000).")
    ] = 1_000,
    json_out: JsonOption = False,
) -> None:
    """Admit one Run per occurrence of a schedule in [--from, --to), with the admission
    key the live schedule uses: an occurrence never gets two Runs."""
    now = wall_clock_ms()
    start, end = parse_time("--from", from_time, now), parse_time("--to", to_time, now)
    with opened(ctx) as rt:
        result = rt.backfill_schedule(schedule_id, start, end, max_runs=max_runs, dry_run=dry_run)
    if wants_json(ctx, json_out):
        write_json(result)
        return
    table = Table("scheduled for", "run", "status", box=None)
    for run in result.runs:
        table.add_row(when(run.scheduled_for_ms, now), run.run_id, run.status)
    console = stdout_console()
    console.print(table)
    verb = "would admit" if dry_run else "admitted"
    created = sum(1 for run in result.runs if run.status != "existing")
    console.print(f"{verb} {created} of {len(result.runs)} occurrences")
    if result.more:
        last = result.runs[-1].scheduled_for_ms
        console.print(f"more occurrences remain: run again with --from {last + 1}")
