"""The typer application and its global options (`--db`, `--profile`, `--json`,
`--connect-timeout-s`, `-v`), shared by every command through the click context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperOption

from qlflow.cli import logs
from qlflow.cli.exits import CliError

RUN_AND_HOST = "Run and host"
INSPECT = "Inspect"
ADMINISTER = "Administer"


@dataclass
class Settings:
    """The global options, shared by every command through the click context."""

    db: str | None
    profile: str | None
    json: bool
    connect_timeout_s: float | None = None

    @property
    def url(self) -> str:
        """The store URL: `--db`, else the default (`$QLFLOW_DB`, else ./qlflow.db)."""
        from qlflow.runtime import default_url

        return self.db or default_url()


app = typer.Typer(
    name="qlflow",
    help=(
        "Run durable DAG workflows (plugin package workflows) on SQLite or PostgreSQL.\n\n"
        "A package is a folder with a [bold]qlflow.toml[/bold]. Publish it, start a "
        "Workflow, and let a host drive it: [bold]qlflow run[/bold] does all three "
        "in one go; [bold]qlflow serve[/bold] is a long-running host; "
        "[bold]qlflow worker[/bold] runs Attempts for a host that cycles elsewhere."
    ),
    epilog=(
        "Example: [bold]qlflow run examples/nightly nightly[/bold]  (embedded SQLite in "
        "./qlflow.db)\n\n"
        "Exit status: 0 ok, 1 run failed, 2 bad input, 3 run cancelled, 4 run timed out, "
        "5 store unavailable (unreachable, busy, disk full, read-only: try again), "
        "130 interrupted."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonOption = Annotated[bool, typer.Option("--json", help="Write one JSON document to stdout.")]

_value_column = TyperOption.display_type_rich


def _flags_take_no_value(self: TyperOption, ctx: Any) -> str | None:
    # typer's rich help prints a type beside every option, a flag's too ("--json
    # <bool>" reads as if it wanted "--json true"); a flag or a counter takes none
    if self.is_flag or self.count:
        return None
    return _value_column(self, ctx)


TyperOption.display_type_rich = _flags_take_no_value  # type: ignore[method-assign]


def version_text() -> str:
    """What `qlflow --version` prints: the installed version (and Python's)."""
    import platform
    from importlib import metadata

    try:
        version = metadata.version("qlflow")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return f"qlflow {version} (Python {platform.python_version()})"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def _global_options(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help=(
                "Store URL: sqlite:///relative.db, sqlite:////abs/path.db or "
                "postgresql://user@host/db. Default: $QLFLOW_DB, else ./qlflow.db."
            ),
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="edge | standalone | cluster (default: standalone on SQLite, cluster on "
            "PostgreSQL).",
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Machine output for every read command.")
    ] = False,
    connect_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--connect-timeout-s",
            help="PostgreSQL: give up connecting after this many seconds (default 10).",
        ),
    ] = None,
    verbose: Annotated[
        int,
        typer.Option("-v", "--verbose", count=True, help="Log to stderr (-v info, -vv debug)."),
    ] = 0,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print qlflow's version and exit.",
        ),
    ] = False,
) -> None:
    logs.configure(verbose)
    if connect_timeout_s is not None and connect_timeout_s <= 0:
        raise CliError(f"--connect-timeout-s must be positive, got {connect_timeout_s}")
    ctx.obj = Settings(db=db, profile=profile, json=json_out, connect_timeout_s=connect_timeout_s)


def settings(ctx: typer.Context) -> Settings:
    """The global options of this invocation."""
    return ctx.obj if isinstance(ctx.obj, Settings) else Settings(None, None, False)


def wants_json(ctx: typer.Context, json_out: bool) -> bool:
    """Whether to write JSON: the command's `--json` or the global one."""
    return json_out or settings(ctx).json
