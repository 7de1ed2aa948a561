"""`qlflow notifications` lists the notification outbox: pending and failed deliveries
(`--all` adds the delivered ones). `qlflow serve` delivers them (docs/DESIGN.md,
"Notifications")."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from domain.notify import Delivery
from qlflow.cli.app import INSPECT, JsonOption, app, wants_json
from qlflow.cli.opening import opened
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.times import relative
from qlflow.clock import wall_clock_ms
from qlflow.notifications import deliveries

AllOption = Annotated[bool, typer.Option("--all", help="Include delivered notifications.")]


@app.command(
    rich_help_panel=INSPECT,
    epilog="Example: [bold]qlflow notifications[/bold]; [bold]qlflow notifications --json[/bold]",
)
def notifications(
    ctx: typer.Context, json_out: JsonOption = False, everything: AllOption = False
) -> None:
    """List failure notifications still pending or failed for good: Run, status,
    target, attempts, next try, last error. `qlflow serve` delivers them."""
    with opened(ctx, read_only=True) as rt:
        found = deliveries(rt.store, delivered=everything)
    if wants_json(ctx, json_out):
        write_json([{**asdict(d), "state": d.state} for d in found])
        return
    console = stdout_console()
    if not found:
        console.print("no pending or failed notifications")
        return
    console.print(notifications_table(found, wall_clock_ms()))


def _target(delivery: Delivery) -> str:
    target = delivery.target
    if "webhook" in target:
        return str(target["webhook"])
    return " ".join(target["command"])


def notifications_table(found: list[Delivery], now_ms: int) -> Table:
    """The deliveries as a table, times relative to `now_ms`."""
    table = Table(title="notifications", title_justify="left")
    for column in ("run", "workflow", "status", "state", "target", "attempts", "next try", "error"):
        table.add_column(column)
    for d in found:
        next_try = relative(d.retry_at_ms, now_ms) if d.is_pending else "-"
        table.add_row(
            d.run_id, d.workflow_key, d.status, d.state, _target(d), str(d.attempts), next_try,
            d.last_error or "",
        )  # fmt: skip
    return table
