"""Output of the command line: rich tables for people, orjson documents for machines."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

STATUS_STYLES = {
    "succeeded": "green",
    "running": "cyan",
    "starting": "cyan",
    "claimed": "blue",
    "ready": "blue",
    "pending": "dim",
    "failed": "red",
    "lost": "red",
    "timed_out": "magenta",
    "cancelled": "yellow",
    "skipped": "yellow",
    "waiting_approval": "blue",
}

PHASES = ("recovery", "cancellation", "frontier", "admission")


def stdout_console() -> Console:
    """The console for results (markup off, as for stderr). Piped output is not cut
    at 80 columns: a log path or an id stays whole on one line (COLUMNS wins if set)."""
    console = Console(highlight=False, markup=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, markup=False, width=200)
    return console


def stderr_console() -> Console:
    # markup off: ids, paths and messages print as they are, brackets included
    return Console(stderr=True, highlight=False, markup=False)


# -- JSON -------------------------------------------------------------------------


def _default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def jsonable(value: Any) -> Any:
    """`value` as plain JSON types (dataclasses, mappings and tuples converted)."""
    return orjson.loads(orjson.dumps(value, default=_default))


def write_json(value: Any, *, pretty: bool = True) -> None:
    """One JSON document on stdout (`pretty=False`: one line, for JSON lines)."""
    option = orjson.OPT_INDENT_2 if pretty else 0
    sys.stdout.buffer.write(orjson.dumps(value, default=_default, option=option) + b"\n")
    sys.stdout.buffer.flush()


# -- small formatters --------------------------------------------------------------


def at(ms: int | None) -> str:
    """Wall-clock time of an epoch-ms value, local time, millisecond precision."""
    if ms is None:
        return "-"
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{millis:03d}"


def duration(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def status_text(status: str | None) -> Text:
    if status is None:
        return Text("-", style="dim")
    return Text(status, style=STATUS_STYLES.get(status, ""))


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


# -- tables -------------------------------------------------------------------------


def key_values(title: str | None, rows: Iterable[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, box=None, pad_edge=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value if isinstance(value, Text) else _cell(value))
    return table


def publication_table(publication) -> Table:
    created = getattr(publication, "created", None)
    return key_values(
        "published" if created else "unchanged (already the head)",
        [
            ("publication", publication.publication_id),
            ("package", publication.package),
            ("publisher", publication.publisher),
            ("generation", publication.generation),
            ("workflows", ", ".join(getattr(publication, "workflows", ()) or ())),
            ("status", getattr(publication, "status", None)),
            ("revision digest", publication.revision_digest),
        ],
    )


def receipt_table(receipt) -> Table:
    return key_values(
        f"admission {receipt.status}",
        [
            ("run", receipt.run_id),
            ("admission key", receipt.admission_key),
            ("plan digest", receipt.plan_digest),
            ("receipt digest", receipt.receipt_digest),
        ],
    )


def runs_table(runs) -> Table:
    table = Table(title=f"{len(runs)} run(s)", title_justify="left")
    for column in ("run", "package", "workflow", "status", "admitted", "ended", "cancel", "code"):
        table.add_column(column)
    for run in runs:
        table.add_row(
            run.run_id,
            run.package,
            run.workflow_key,
            status_text(run.status),
            at(run.admitted_at_ms),
            at(run.terminal_at_ms),
            _cell(run.cancel_reason),
            _cell(run.error_code or run.result_code),
        )
    return table


def run_header(run) -> Table:
    rows: list[tuple[str, Any]] = [
        ("run", run.run_id),
        ("workflow", f"{run.package} / {run.workflow_key}"),
        ("status", status_text(run.status)),
        ("version", run.version),
        ("admitted", at(run.admitted_at_ms)),
    ]
    if run.deadline_ms is not None:
        rows.append(("deadline", at(run.deadline_ms)))
    if run.cancel_requested_at_ms is not None:
        rows.append(("cancel", f"{run.cancel_reason} at {at(run.cancel_requested_at_ms)}"))
    if run.terminal_at_ms is not None:
        rows.append(("ended", at(run.terminal_at_ms)))
    if run.error_code or run.result_code:
        rows.append(("code", run.error_code or run.result_code))
    return key_values(None, rows)


def steps_table(run, now_ms: int | None = None, *, detail: bool = True) -> Table:
    """The Run's steps: status, current Attempt, duration, result (and log path)."""
    now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    table = Table(title="steps", title_justify="left")
    table.add_column("step")
    if detail:
        table.add_column("needs")
    table.add_column("status")
    table.add_column("attempt")
    table.add_column("duration", justify="right")
    table.add_column("result", overflow="fold")
    if detail:
        table.add_column("worker")
    for step in _in_plan_order(run.steps):
        attempt = step.attempts[-1] if step.attempts else None
        row = [step.step_key]
        if detail:
            row.append(", ".join(step.needs) or "-")
        row.append(status_text(step.status))
        row.append(f"#{attempt.attempt_number} {attempt.status}" if attempt else "-")
        row.append(duration(_attempt_duration(attempt, now_ms)))
        row.append(_result(step, attempt))
        if detail:
            row.append(_cell(attempt.worker_id if attempt else None))
        table.add_row(*row)
    return table


def log_paths(run) -> Table | None:
    """Where each step's latest Attempt wrote its output (the paths are long, so
    they go under the table, one a line)."""
    rows = []
    for step in _in_plan_order(run.steps):
        output = (step.attempts[-1].output or {}) if step.attempts else {}
        if output.get("log_path"):
            rows.append((step.step_key, output["log_path"]))
    return key_values("logs", rows) if rows else None


def run_document(run, now_ms: int | None = None) -> Group:
    parts = [run_header(run), Text(""), steps_table(run, now_ms)]
    logs = log_paths(run)
    if logs is not None:
        parts += [Text(""), logs]
    return Group(*parts)


def _in_plan_order(steps: Mapping[str, Any]) -> list:
    """Steps in dependency order (a step after everything it needs), then by key."""
    placed: list = []
    seen: set[str] = set()
    remaining = dict(sorted(steps.items()))
    while remaining:
        ready = [k for k, s in remaining.items() if all(n in seen for n in s.needs)]
        if not ready:  # a plan is acyclic; stay total anyway
            ready = list(remaining)
        for key in ready:
            placed.append(remaining.pop(key))
            seen.add(key)
    return placed


def _attempt_duration(attempt, now_ms: int) -> int | None:
    if attempt is None or attempt.started_at_ms is None:
        return None
    end = attempt.ended_at_ms if attempt.ended_at_ms is not None else now_ms
    return end - attempt.started_at_ms


def _result(step, attempt) -> str:
    parts = []
    if step.result_code:
        parts.append(step.result_code)
    output = (attempt.output or {}) if attempt else {}
    if "exit_code" in output and output["exit_code"] is not None:
        parts.append(f"exit {output['exit_code']}")
    if output.get("error"):
        parts.append(str(output["error"]))
    return ", ".join(parts) or "-"


def events_table(records) -> Table:
    table = Table(title=f"{len(records)} event(s)", title_justify="left")
    for column in ("pos", "at", "stream", "ver", "type", "data"):
        table.add_column(column, overflow="fold")
    for record in records:
        table.add_row(*event_row(record))
    return table


def event_row(record) -> tuple[str, ...]:
    return (
        str(record.global_position),
        at(record.metadata.get("at_ms")),
        record.stream_id,
        str(record.stream_version),
        record.type,
        event_summary(record),
    )


_SUMMARY_SKIP = {"plan", "revision", "publication", "admission", "output"}


def event_summary(record) -> str:
    """A one-line summary of an event's data (big documents left out)."""
    parts = []
    for key, value in record.data.items():
        if key in _SUMMARY_SKIP or value is None:
            continue
        if isinstance(value, (dict, list)):
            continue
        parts.append(f"{key}={value}")
    output = record.data.get("output")
    if isinstance(output, Mapping) and "exit_code" in output:
        parts.append(f"exit_code={output['exit_code']}")
    return " ".join(parts)


def cycle_table(result) -> Table | Group:
    table = Table(title="cycle", title_justify="left")
    table.add_column("phase")
    columns = ("scanned", "changed", "settled_runs", "settled_attempts", "blocked", "conflicts")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    errors = []
    for phase in PHASES:
        page = getattr(result, phase)
        table.add_row(phase, *(str(getattr(page, column, 0)) for column in columns))
        errors += [f"{phase}: {error}" for error in getattr(page, "errors", ())]
    if errors:
        return Group(table, *(Text(f"error: {line}", style="red") for line in errors))
    return table


def cycle_document(result) -> dict[str, Any]:
    return {phase: jsonable(getattr(result, phase)) for phase in PHASES}


def view_of_aggregate(aggregate):
    """A Run aggregate (the state at some version) in the shape `show` prints:
    the read models' RunView, with what only the read models know (times of
    attempts, end of the Run) left empty."""
    from projections.views import AttemptView, RunView, StepView

    run = aggregate.run
    plan = run.plan
    steps = {}
    for key, step in aggregate.steps.items():
        attempts = []
        for attempt_id in step.attempt_ids:
            attempt = aggregate.attempts[attempt_id]
            lease = attempt.lease
            attempts.append(
                AttemptView(
                    attempt_id=attempt.attempt_id,
                    status=attempt.status,
                    attempt_number=attempt.attempt_number,
                    lease_id=lease.lease_id if lease else None,
                    lease_version=lease.version if lease else None,
                    lease_status=lease.status if lease else None,
                    worker_id=attempt.worker_id or (lease.worker_id if lease else None),
                    expires_at_ms=lease.expires_at_ms if lease else None,
                    started_at_ms=None,
                    ended_at_ms=None,
                    result_code=attempt.result_code,
                    output=dict(attempt.output) if attempt.output is not None else None,
                )
            )
        steps[key] = StepView(
            step_key=key,
            step_run_id=step.step_run_id,
            task_ref=step.task_ref,
            needs=tuple(step.needs),
            status=step.status,
            result_code=step.result_code,
            epoch=step.epoch,
            attempts=attempts,
        )
    return RunView(
        run_id=run.run_id,
        package=plan.package,
        workflow_key=plan.workflow_key,
        publication_id=plan.publication_id,
        plan_digest=plan.plan_digest,
        admission_key=run.admission_key,
        status=run.status,
        version=run.version,
        admitted_at_ms=run.admitted_at_ms,
        deadline_ms=run.deadline_ms,
        cancel_requested_at_ms=run.cancel_requested_at_ms,
        cancel_reason=run.cancel_reason,
        result_code=run.result_code,
        error_code=run.error_code,
        terminal_at_ms=None,
        steps=steps,
    )


def rebuild_table(summary) -> Group:
    """What a rebuild did: events replayed, log position, and rows per table."""
    facts = key_values(
        None,
        [
            ("events", summary.events),
            ("position", summary.position),
            ("seconds", f"{summary.seconds:.3f}"),
        ],
    )
    rows = Table(box=None, pad_edge=False)
    rows.add_column("table")
    rows.add_column("rows", justify="right")
    for name, count in sorted(summary.tables.items()):
        rows.add_row(name, str(count))
    title = Text("read models rebuilt from the log", style="bold")
    return Group(title, facts, Text(""), rows)
