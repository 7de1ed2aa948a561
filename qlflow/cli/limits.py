"""`qlflow limits` lists the concurrency limits with their slots in use and who holds
them; `qlflow limits set TARGET N` changes one at runtime (docs/DESIGN.md "Flow
control")."""

from __future__ import annotations

import getpass
from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from projections.limits import LimitView
from qlflow.cli.app import ADMINISTER, JsonOption, app, wants_json
from qlflow.cli.opening import opened
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.times import when
from qlflow.clock import wall_clock_ms

limits_app = typer.Typer(
    name="limits",
    help=(
        "List the concurrency limits (declared by [bold]concurrency[/bold] on a Task, "
        "[bold]max_running[/bold] or [bold]concurrency[/bold] on a Workflow) with their "
        "slots in use and who holds them; [bold]limits set[/bold] changes one."
    ),
    invoke_without_command=True,
    epilog=(
        "Examples: [bold]qlflow limits[/bold]; [bold]qlflow limits set task:etl/fetch 4"
        "[/bold]; [bold]qlflow limits set 'task:etl/fetch[eu]' 1[/bold]; "
        "[bold]qlflow limits set workflow:etl/nightly 2[/bold]"
    ),
)
app.add_typer(limits_app, rich_help_panel=ADMINISTER)


@limits_app.callback()
def limits(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """List the limits: the limit in force, where it comes from, slots in use, what
    waits for one, and who holds them."""
    if ctx.invoked_subcommand is not None:
        return
    with opened(ctx, read_only=True) as rt:
        found = rt.limits()
        now = rt.clock_ms()
    if wants_json(ctx, json_out):
        write_json([asdict(view) for view in found])
        return
    console = stdout_console()
    if not found:
        console.print(
            "no limits: declare concurrency = N on a Task, or max_running = N on a "
            "Workflow, and publish it"
        )
        return
    console.print(limits_table(found, now))


def limits_table(found: list[LimitView], now_ms: int) -> Table:
    """The limits as a table, holders' lease expiries relative to `now_ms`."""
    table = Table(title="limits", title_justify="left")
    for column in ("limit", "in force", "in use", "waiting", "held by"):
        table.add_column(column)
    for view in found:
        table.add_row(
            view.target + (f"  (key {view.key})" if view.key else ""),
            _source(view, now_ms),
            str(view.in_use),
            str(view.waiting),
            _holders(view, now_ms),
        )
    return table


def _source(view: LimitView, now_ms: int) -> str:
    if view.limit is None:
        return "-"
    if view.set_to is not None:
        return f"{view.limit} (set by {view.set_by} {when(view.set_at_ms, now_ms)})"
    if view.declared is not None and view.limit == view.declared:
        return f"{view.limit} (declared)"
    return f"{view.limit} (of its limit)"


def _holders(view: LimitView, now_ms: int) -> str:
    lines = []
    for holder in view.holders[:8]:
        if holder.attempt_id is None:
            lines.append(f"run {holder.run_id}")
        else:
            lines.append(
                f"{holder.run_id}/{holder.step_key} on {holder.worker_id} "
                f"(lease until {when(holder.until_ms, now_ms)})"
            )
    if len(view.holders) > 8:
        lines.append(f"... and {len(view.holders) - 8} more")
    return "\n".join(lines) or "-"


@limits_app.command(
    "set",
    epilog=(
        "Example: [bold]qlflow limits set task:etl/fetch 4[/bold]: at most 4 Attempts of "
        "Task fetch of package etl leased at once, from the next lease on"
    ),
)
def set_limit(
    ctx: typer.Context,
    target: Annotated[
        str,
        typer.Argument(
            help="task:<package>/<task>, workflow:<package>/<workflow>, or one key value "
            "of a keyed limit: task:<package>/<task>[<value>]."
        ),
    ],
    limit: Annotated[int, typer.Argument(metavar="N", help="The new limit, 1..10000.")],
    by: Annotated[
        str | None, typer.Option("--by", help="Who sets it (default: your user name).")
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Change a declared limit at runtime, recorded as an event (who, when, old and
    new), in force from the next lease."""
    with opened(ctx) as rt:
        change = rt.set_limit(target, limit, by=by or _user())
    if wants_json(ctx, json_out):
        write_json(change)
        return
    console = stdout_console()
    if not change.changed:
        console.print(f"{change.target} was {change.new} already: nothing written")
        return
    console.print(
        f"{change.target}: {change.old} -> {change.new} (by {change.set_by}, "
        f"{when(change.set_at_ms, wall_clock_ms())})"
    )


def _user() -> str:
    try:
        return "user:" + getpass.getuser()
    except (KeyError, OSError):  # no user name in this environment
        return "user"
