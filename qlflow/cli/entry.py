"""The console-script entry point: run a command, map what it raised to one line on
stderr and an exit status (see `qlflow.cli.exits`), never a traceback."""

from __future__ import annotations

import sys
import traceback
from typing import Any, cast

import typer

from domain.transitions import Status
from qlflow.cli import logs
from qlflow.cli.app import app
from qlflow.cli.exits import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    error_line,
    exit_code_of,
    message_of,
)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the command line and exit with its status."""
    command = typer.main.get_command(app)
    one_line_summaries(command)
    try:
        code = command.main(args=argv, prog_name="qlflow", standalone_mode=False)
    except typer.Abort:
        error_line(Status.INTERRUPTED)
        code = EXIT_INTERRUPTED
    except typer.TyperException as error:  # usage errors: typer's own click exceptions
        if type(error).__name__ == "NoArgsIsHelpError":
            cast(Any, error).show()  # the vendored click's exception prints the help
        else:
            message = error.format_message() if hasattr(error, "format_message") else str(error)
            error_line(f"{message} (see --help)")
        code = getattr(error, "exit_code", EXIT_BAD_INPUT)
    except (Exception, KeyboardInterrupt) as error:
        known = exit_code_of(error)
        if known is not None:
            error_line(message_of(error))
            code = known
        else:
            if logs.verbosity() >= 2:
                traceback.print_exc()
            error_line(
                f"internal error: {type(error).__name__}: {error} "
                "(rerun with -vv for the traceback, and please report it)"
            )
            code = EXIT_FAILED
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def one_line_summaries(command: Any) -> None:
    """Give every command a one-line summary for its group's command table: the first
    paragraph of its help with the docstring's line breaks joined (typer's rich mode
    prints them as they are, so a summary wrapped in the source broke mid-sentence)."""
    for sub in getattr(command, "commands", {}).values():  # a group's (typer's own click)
        one_line_summaries(sub)
    if command.short_help is None and command.help:
        command.short_help = " ".join(command.help.split("\n\n")[0].split())
