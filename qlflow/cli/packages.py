"""`qlflow packages`: each package installation with its generations, which one is
the current head (what new Runs start from), which are withdrawn or quarantined,
and whether its publisher is trusted."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from projections.package_views import PackageView
from qlflow.cli.app import INSPECT, JsonOption, app, wants_json
from qlflow.cli.opening import opened
from qlflow.cli.output import jsonable, stdout_console, write_json
from qlflow.cli.times import when
from qlflow.clock import wall_clock_ms

_STATUS_STYLES = {"active": "green", "withdrawn": "yellow", "quarantined": "red", "revoked": "red"}


@app.command(
    rich_help_panel=INSPECT,
    epilog="Example: [bold]qlflow packages[/bold]; [bold]qlflow packages backup --json[/bold]",
)
def packages(
    ctx: typer.Context,
    package: Annotated[
        str | None, typer.Argument(metavar="PACKAGE", help="Only this package.")
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """List published packages: generations, the current head, withdrawn or quarantined
    ones, and the publisher's trust."""
    with opened(ctx) as rt:
        found = rt.packages(package)
    if wants_json(ctx, json_out):
        write_json([_document(view) for view in found])
        return
    console = stdout_console()
    if not found:
        console.print("no package is published yet: qlflow publish FOLDER")
        return
    now = wall_clock_ms()
    for number, view in enumerate(found):
        if number:
            console.print("")
        console.print(_table(view, now))


def _table(view: PackageView, now_ms: int) -> Table:
    trust = Text(view.publisher_status, style=_STATUS_STYLES.get(view.publisher_status, ""))
    title = Text.assemble(
        (view.package, "bold"),
        f"  ({view.project}/{view.installation})  publisher {view.publisher}: ",
        trust,
    )
    table = Table(title=title, title_justify="left")
    for column in ("generation", "status", "head", "published", "workflows", "publication"):
        table.add_column(column, overflow="fold")
    for publication in view.generations:
        table.add_row(
            str(publication.generation),
            Text(publication.status, style=_STATUS_STYLES.get(publication.status, "")),
            "head" if publication.head else "",
            when(publication.published_at_ms, now_ms),
            ", ".join(publication.workflows) or "-",
            publication.publication_id,
        )
    return table


def _document(view: PackageView) -> dict[str, Any]:
    head = view.head
    document: dict[str, Any] = jsonable(view)
    document["head"] = head.publication_id if head is not None else None
    return document
