"""`qlflow rerun`: admit a new Run from a finished one, reusing what succeeded
(docs/DESIGN.md "Reruns")."""

from __future__ import annotations

from typing import Annotated

import typer

from domain.params import param_texts
from qlflow.cli.app import RUN_AND_HOST, JsonOption, app, wants_json
from qlflow.cli.opening import opened
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.running import ParamOption
from qlflow.cli.tables import receipt_table


@app.command(
    rich_help_panel=RUN_AND_HOST,
    epilog="Examples: [bold]qlflow rerun 0b1c2d3e[/bold]  (the steps that did not succeed "
    "and what follows them run again, the rest is reused); [bold]qlflow rerun 0b1c2d3e "
    "--from load --head[/bold]  (load and its dependents, on the package's current head)",
)
def rerun(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique prefix).")],
    from_steps: Annotated[
        list[str] | None,
        typer.Option("--from", metavar="STEP", help="Run this step and its dependents again."),
    ] = None,
    head: Annotated[
        bool, typer.Option("--head", help="Bind the package's current head, not the same plan.")
    ] = False,
    admission_key: Annotated[
        str | None, typer.Option(help="Idempotency key: the same key gives the same Run.")
    ] = None,
    param: ParamOption = None,
    json_out: JsonOption = False,
) -> None:
    """Admit a rerun of a finished Run: its succeeded steps outside --from (and their
    downstream) are reused with their outputs, every other step runs."""
    params = param_texts(param or [])
    with opened(ctx) as rt:
        source = rt.resolve_run_id(run_id)
        receipt = rt.rerun(
            source,
            from_steps=from_steps or None,
            plan="head" if head else "same",
            admission_key=admission_key,
            params=params or None,
        )
        view = rt.get_run(receipt.run_id)
    reused = sorted(key for key, step in view.steps.items() if step.reused_from is not None)
    if wants_json(ctx, json_out):
        write_json({"receipt": receipt, "rerun_of": source, "reused": reused})
        return
    console = stdout_console()
    console.print(receipt_table(receipt))
    console.print(f"rerun of {source}; reused: {', '.join(reused) or 'nothing'}")
    console.print("a host drives the steps that run: qlflow serve --package-dir FOLDER")
