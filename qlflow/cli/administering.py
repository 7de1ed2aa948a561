"""Administering commands: `publish` a package, `rebuild` and `verify` the read
models, and create PostgreSQL roles (`pg-roles`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from domain.errors import QlflowError
from qlflow.cli.app import ADMINISTER, JsonOption, app, settings, wants_json
from qlflow.cli.exits import EXIT_FAILED, CliError
from qlflow.cli.opening import opened, redact
from qlflow.cli.options import package_folder
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.progress import replay_progress
from qlflow.cli.tables import publication_table, rebuild_table


@app.command(
    rich_help_panel=ADMINISTER,
    epilog="Example: [bold]qlflow publish examples/nightly[/bold]  (prints the publication; "
    "publishing unchanged content again is a no-op)",
)
def publish(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Package folder (or its qlflow.toml).")],
    json_out: JsonOption = False,
) -> None:
    """Publish a package folder: a new generation when its content changed."""
    folder = package_folder(path)
    with opened(ctx) as rt:
        publication = rt.publish(folder)
    if wants_json(ctx, json_out):
        write_json(publication)
    else:
        stdout_console().print(publication_table(publication))


@app.command(
    rich_help_panel=ADMINISTER,
    epilog="Example: [bold]qlflow rebuild[/bold]  (replays the whole log into fresh read "
    "models and swaps them in atomically)",
)
def rebuild(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """Rebuild every read model from the event log."""
    as_json = wants_json(ctx, json_out)
    with opened(ctx) as rt, replay_progress("rebuilding", enabled=not as_json) as progress:
        summary = rt.rebuild_projections(progress)
    if as_json:
        write_json(summary.to_dict())
    else:
        stdout_console().print(rebuild_table(summary))


@app.command(
    rich_help_panel=ADMINISTER,
    epilog="Example: [bold]qlflow verify[/bold]  (exit 0 when every read model equals a "
    "replay of the log, 1 otherwise, listing the differences)",
)
def verify(ctx: typer.Context, json_out: JsonOption = False) -> None:
    """Check that every read model equals a fresh replay of the log."""
    as_json = wants_json(ctx, json_out)
    with (
        opened(ctx, read_only=True) as rt,
        replay_progress("verifying", enabled=not as_json) as progress,
    ):
        report = rt.verify_projections(progress)
    if as_json:
        write_json(report.to_dict())
    else:
        console = stdout_console()
        for line in report.lines():
            console.print(line, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command(
    "pg-roles",
    rich_help_panel=ADMINISTER,
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

    url = settings(ctx).url
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
    if wants_json(ctx, json_out):
        write_json({"schema": urls.schema, "roles": dict(urls.roles), "urls": by_kind})
        return
    console = stdout_console()
    for kind, role_url in by_kind.items():
        console.print(f"{kind:<10} {redact(role_url)}", soft_wrap=True)
