"""Step logs on the command line: `logs` (a Run's, a step's or one Attempt's output,
read from the store from any machine that reaches it, or followed as it runs) and
`prune` (delete old logs; events are never touched)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from eventstore import logs as log_store
from projections.step_logs import LogChunk
from qlflow.cli.app import ADMINISTER, INSPECT, JsonOption, app, wants_json
from qlflow.cli.exits import CliError
from qlflow.cli.opening import opened
from qlflow.cli.options import at_least
from qlflow.cli.output import stdout_console, write_json
from qlflow.cli.signals import SignalRelay
from qlflow.cli.times import parse_duration, when
from qlflow.clock import wall_clock_ms
from qlflow.runtime import Runtime


@app.command(
    rich_help_panel=INSPECT,
    epilog=(
        "Examples: [bold]qlflow logs 0b1c2d3e[/bold] (every step of the Run); "
        "[bold]qlflow logs 0b1c2d3e fetch --attempt 2[/bold]; "
        "[bold]qlflow logs 0b1c2d3e fetch --follow[/bold] (until the Run ends or Ctrl-C)"
    ),
)
def logs(
    ctx: typer.Context,
    run_id: Annotated[
        str,
        typer.Argument(metavar="RUN", help="Run id, or any unique prefix (run: may be left out)."),
    ],
    step_key: Annotated[str | None, typer.Argument(metavar="STEP", help="Only this step.")] = None,
    attempt: Annotated[
        str | None,
        typer.Option(
            metavar="N|ID",
            help="Only this Attempt of the step: its number (1 is the first) or its id.",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new output until the Run ends."),
    ] = False,
    interval_ms: Annotated[int, typer.Option(help="Poll interval of --follow.")] = 500,
    json_out: JsonOption = False,
) -> None:
    """Print what a Run's steps wrote to stdout and stderr, from the store."""
    at_least("--interval-ms", interval_ms)
    as_json = wants_json(ctx, json_out)
    with opened(ctx) as rt:
        run_id = rt.resolve_run_id(run_id)
        chosen = _attempt(rt, run_id, step_key, attempt)
        printer = _Printer(as_json)
        if not follow:
            found = rt.logs(run_id, step_key, chosen)
            if as_json:
                write_json([_document(c) for c in found])
            else:
                printer.print(found)
                if not found:
                    _say_nothing(rt, run_id, step_key, chosen)
            return
        _follow(rt, run_id, step_key, chosen, printer, interval_ms / 1000)


def _attempt(
    rt: Runtime, run_id: str, step_key: str | None, attempt: str | None
) -> int | str | None:
    """`--attempt` as the API takes it: a number within the step, or an Attempt id."""
    if attempt is None:
        return None
    if attempt.isdigit():
        if step_key is None:
            raise CliError("--attempt N counts within one step: give the STEP too")
        number = int(attempt)
        at_least("--attempt", number)
        return number
    return rt.resolve_attempt_id(attempt, run_id)


def _say_nothing(rt: Runtime, run_id: str, step_key: str | None, attempt: int | str | None) -> None:
    named = rt.log_attempts(run_id, step_key, attempt)
    what = f"step {step_key}" if step_key else f"run {run_id}"
    pruned = log_store.pruned_at(rt.store, [a.attempt_id for a in named])
    if not named:
        sys.stderr.write(f"qlflow: {what} has no Attempt yet, so no output\n")
    elif pruned:
        at = max(pruned.values())
        sys.stderr.write(
            f"qlflow: the log of {what} was pruned by retention on {when(at, wall_clock_ms())}\n"
        )
    else:
        sys.stderr.write(f"qlflow: {what} wrote no output\n")


def _follow(
    rt: Runtime,
    run_id: str,
    step_key: str | None,
    attempt: int | str | None,
    printer: _Printer,
    interval_s: float,
) -> None:
    """Print output as it is stored until the Run is terminal (and everything it wrote
    is printed), or SIGINT / SIGTERM."""
    stop = threading.Event()
    seen: dict[str, int] = {}
    with SignalRelay(lambda _signum: stop.set()):
        while True:
            ended = rt.get_run(run_id).terminal
            found = rt.logs(run_id, step_key, attempt, after=seen)
            for chunk in found:
                seen[chunk.attempt_id] = chunk.seq
            printer.print(found)
            if ended or stop.wait(interval_s):
                return


class _Printer:
    """Writes chunks for people (a header per Attempt, then its text as it is) or as
    JSON lines."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._current: str | None = None
        self._ends_line = True  # the last text written ended its line

    def print(self, chunks: Sequence[LogChunk]) -> None:
        for chunk in chunks:
            if self.as_json:
                write_json(_document(chunk), pretty=False)
                continue
            if chunk.attempt_id != self._current:
                self._end_line()
                self._current = chunk.attempt_id
                stdout_console().print(
                    f"==> {chunk.step_key}, attempt {chunk.attempt_number} "
                    f"({chunk.attempt_id}) <==",
                    style="bold",
                    soft_wrap=True,
                )
            sys.stdout.write(chunk.text)
            self._ends_line = chunk.text.endswith("\n")
        sys.stdout.flush()

    def _end_line(self) -> None:
        if not self._ends_line:
            sys.stdout.write("\n")
            self._ends_line = True


def _document(chunk: LogChunk) -> dict[str, Any]:
    return {
        "run_id": chunk.run_id,
        "step_key": chunk.step_key,
        "attempt_number": chunk.attempt_number,
        "attempt_id": chunk.attempt_id,
        "seq": chunk.seq,
        "at_ms": chunk.at_ms,
        "stream": chunk.stream,
        "text": chunk.text,
    }


@app.command(
    rich_help_panel=ADMINISTER,
    epilog="Example: [bold]qlflow prune --logs-older-than 30d[/bold]  (deletes each step log "
    "last written more than 30 days ago; never an event)",
)
def prune(
    ctx: typer.Context,
    logs_older_than: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="Delete step logs last written longer ago than this (90m, 12h, 30d, 2w).",
        ),
    ],
    json_out: JsonOption = False,
) -> None:
    """Delete old step logs from the store (the event log is never touched)."""
    now = wall_clock_ms()
    before_ms = now - parse_duration("--logs-older-than", logs_older_than)
    with opened(ctx) as rt:
        pruned = rt.prune_logs(max(0, before_ms))
    if wants_json(ctx, json_out):
        write_json({**_plain(pruned), "before_ms": before_ms})
        return
    stdout_console().print(
        f"deleted {pruned.attempts} step log(s) last written before "
        f"{when(before_ms, now)}: {pruned.chunks} chunk(s), {pruned.bytes} bytes",
        soft_wrap=True,
    )


def _plain(pruned: Any) -> dict[str, int]:
    return {"attempts": pruned.attempts, "chunks": pruned.chunks, "bytes": pruned.bytes}
