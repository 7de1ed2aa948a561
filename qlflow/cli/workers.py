"""`qlflow workers` lists the hosts that hold or recently held leases: each worker id,
its host and slots, the Attempts it runs now and its last renewal (docs/DESIGN.md,
"Workers"), from the read models."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from projections.workers import WorkerView
from qlflow.cli.app import INSPECT, JsonOption, app, wants_json
from qlflow.cli.opening import opened
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.times import TIME_HELP, optional_time, when
from qlflow.clock import wall_clock_ms


@app.command(
    rich_help_panel=INSPECT,
    epilog="Examples: [bold]qlflow workers[/bold]; [bold]qlflow workers --since 1d --json[/bold]",
)
def workers(
    ctx: typer.Context,
    since: Annotated[
        str | None,
        typer.Option(
            metavar="TIME",
            help=f"Attempts ended at or after (default: the last hour): {TIME_HELP}.",
        ),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """List the workers that run an Attempt now or held one that ended lately: worker
    id, host, slots, Attempts running, Attempts ended in the window, last renewal,
    last seen. A running Attempt whose lease ran out is counted as expired: its host
    is probably gone, and the next cycle records it lost."""
    now = wall_clock_ms()
    with opened(ctx, read_only=True) as rt:
        store_now = rt.clock_ms()
        found = rt.workers(optional_time("--since", since, now), now_ms=store_now)
    if wants_json(ctx, json_out):
        write_json([{**asdict(view), "holding": view.holding} for view in found])
        return
    console = stdout_console()
    if not found:
        console.print(
            "no workers seen lately: `qlflow serve` or `qlflow worker` lease and run steps"
        )
        return
    console.print(workers_table(found, store_now))


def workers_table(found: list[WorkerView], now_ms: int) -> Table:
    """The workers as a table, times relative to `now_ms`."""
    table = Table(title="workers", title_justify="left")
    for column in ("worker", "host", "slots", "now running", "ended", "last renewal", "last seen"):
        table.add_column(column)
    for view in found:
        running = str(view.running)
        if view.slots is not None:
            running = f"{view.running}/{view.slots}"
        cell = Text(running)
        if view.expired:
            cell.append(f" ({view.expired} expired)", style="red")
        table.add_row(
            view.worker_id,
            view.host or "-",
            "-" if view.slots is None else str(view.slots),
            cell,
            str(view.ended),
            when(view.last_renewal_ms, now_ms),
            when(view.last_seen_ms, now_ms),
        )
    return table
