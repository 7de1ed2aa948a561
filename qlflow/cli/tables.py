"""What the command line shows people: rich tables of publications, receipts, Runs,
steps, events, cycles and rebuilds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from actors.supervisor import CycleResult
from domain import execution as execution_rules
from domain.phases import PHASES
from domain.records import Record
from domain.transitions import Status
from domain.values import AdmissionReceipt, Publication
from projections.rebuild import RebuildSummary
from projections.views import AttemptView, RunView, StepView
from qlflow.cli.output import jsonable
from qlflow.cli.retry_words import attempt_cell, params_text
from qlflow.cli.times import duration, when
from qlflow.clock import wall_clock_ms

STATUS_STYLES = {
    Status.SUCCEEDED.value: "green",
    Status.RUNNING.value: "cyan",
    Status.STARTING.value: "cyan",
    Status.CLAIMED.value: "blue",
    Status.READY.value: "blue",
    Status.PENDING.value: "dim",
    Status.FAILED.value: "red",
    Status.LOST.value: "red",
    Status.TIMED_OUT.value: "magenta",
    Status.CANCELLED.value: "yellow",
    Status.SKIPPED.value: "yellow",
    Status.WAITING_APPROVAL.value: "blue",
}

# -- small formatters --------------------------------------------------------------


def code_text(code: str | None) -> str:
    """A result or error code as people read it: one case for every code."""
    return "-" if not code else code.lower()


def status_text(status: str | None) -> Text:
    """A status, coloured by what it means."""
    if status is None:
        return Text("-", style="dim")
    return Text(status, style=STATUS_STYLES.get(status, ""))


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


# -- tables -------------------------------------------------------------------------


def key_values(title: str | None, rows: Iterable[tuple[str, Any]]) -> Table:
    """A two-column table of labelled facts."""
    table = Table(title=title, show_header=False, box=None, pad_edge=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value if isinstance(value, Text) else _cell(value))
    return table


def publication_table(publication: Publication) -> Table:
    """What `publish` did: the publication, or that nothing changed."""
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


def receipt_table(receipt: AdmissionReceipt) -> Table:
    """An admission receipt."""
    return key_values(
        f"admission {receipt.status}",
        [
            ("run", receipt.run_id),
            ("admission key", receipt.admission_key),
            ("plan digest", receipt.plan_digest),
            ("receipt digest", receipt.receipt_digest),
        ],
    )


def runs_table(
    runs: Sequence[RunView], short_ids: Mapping[str, str], now_ms: int, *, more: bool = False
) -> Table:
    """One row per Run; the run column is a short id that names it (`show`, `why`,
    `logs` and `cancel` take any unique prefix)."""
    title = f"{len(runs)} run(s), newest first" + (" (more: --limit, --until)" if more else "")
    table = Table(title=title, title_justify="left")
    for column in ("run", "workflow", "status", "admitted", "took", "code"):
        table.add_column(column, no_wrap=column in ("run", "admitted"))
    for run in runs:
        ended = run.terminal_at_ms
        took = (ended if ended is not None else now_ms) - run.admitted_at_ms
        table.add_row(
            short_ids.get(run.run_id, run.run_id),
            f"{run.package}/{run.workflow_key}",
            status_text(run.status),
            when(run.admitted_at_ms, now_ms),
            duration(took),
            code_text(run.error_code or run.result_code or _cancel(run)),
        )
    return table


def _cancel(run: RunView) -> str | None:
    return f"cancel: {run.cancel_reason}" if run.cancel_reason else None


def run_header(run: RunView, now_ms: int) -> Table:
    """The facts of one Run above its steps."""
    rows: list[tuple[str, Any]] = [
        ("run", run.run_id),
        ("workflow", f"{run.package} / {run.workflow_key}"),
        ("status", status_text(run.status)),
        ("version", f"{run.version} (see a past state with --at VERSION)"),
        ("admitted", when(run.admitted_at_ms, now_ms)),
    ]
    if run.params:
        rows.append(("params", params_text(run.params)))
    if run.deadline_ms is not None:
        rows.append(("deadline", when(run.deadline_ms, now_ms)))
    if run.cancel_requested_at_ms is not None:
        rows.append(
            ("cancel", f"{run.cancel_reason}, requested {when(run.cancel_requested_at_ms, now_ms)}")
        )
    if run.terminal_at_ms is not None:
        took = duration(run.terminal_at_ms - run.admitted_at_ms)
        rows.append(("ended", f"{when(run.terminal_at_ms, now_ms)}, after {took}"))
    if run.error_code or run.result_code:
        rows.append(("code", code_text(run.error_code or run.result_code)))
    return key_values(None, rows)


def steps_table(run: RunView, now_ms: int | None = None, *, detail: bool = True) -> Table:
    """The Run's steps: status, current Attempt, duration, result (and log path)."""
    now_ms = now_ms if now_ms is not None else wall_clock_ms()
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
        row: list[str | Text] = [step.step_key]
        if detail:
            row.append(", ".join(step.needs) or "-")
        row.append(status_text(step.status))
        row.append(attempt_cell(step, attempt, now_ms))
        row.append(duration(_attempt_duration(attempt, now_ms)))
        row.append(_result(step, attempt))
        if detail:
            row.append(_cell(attempt.worker_id if attempt else None))
        table.add_row(*row)
    return table


def log_paths(run: RunView) -> Table | None:
    """Where each step's latest Attempt wrote its output (the paths are long, so
    they go under the table, one a line)."""
    rows = []
    for step in _in_plan_order(run.steps):
        log_path = step.attempts[-1].log_path if step.attempts else None
        if log_path:
            rows.append((step.step_key, log_path))
    return key_values("logs", rows) if rows else None


def run_document(
    run: RunView,
    now_ms: int | None = None,
    last_lines: Mapping[str, Sequence[str]] | None = None,
    rerun_as: Sequence[str] = (),
) -> Group:
    """A Run as `show` prints it: header, lineage (docs/DESIGN.md "Reruns"), steps,
    where the logs are, and the last lines of each failed step's log (`last_lines`:
    step key -> lines; `rerun_as`: the Runs that rerun this one)."""
    now_ms = now_ms if now_ms is not None else wall_clock_ms()
    parts: list[Table | Text] = [run_header(run, now_ms), *lineage(run, rerun_as)]
    parts += [Text(""), steps_table(run, now_ms)]
    logs = log_paths(run)
    if logs is not None:
        parts += [Text(""), logs]
    for step_key, lines in (last_lines or {}).items():
        if not lines:
            continue
        parts.append(Text(""))
        parts.append(Text(f"last lines of {step_key} (qlflow logs {run.run_id} {step_key}):"))
        parts += [Text(f"  | {line}", style="red") for line in lines]
    return Group(*parts)


def lineage(run: RunView, rerun_as: Sequence[str] = ()) -> list[Text]:
    """Which Run this one reruns, which of its steps were reused from where, and the
    Runs that rerun it: one line each, none for a Run without lineage."""
    lines = []
    if run.rerun_of is not None:
        lines.append(Text(f"rerun of {run.rerun_of}"))
    for step in _in_plan_order(run.steps):
        if step.reused_from is not None:
            origin = step.reused_from
            lines.append(
                Text(f"  {step.step_key}: reused from run {origin['run_id']} "
                     f"(attempt {origin['attempt_id']})", style="dim")
            )  # fmt: skip
    if rerun_as:
        lines.append(Text(f"rerun as {', '.join(rerun_as)}"))
    return lines


def _in_plan_order(steps: Mapping[str, StepView]) -> list[StepView]:
    """Steps in dependency order (a step after everything it needs), then by key."""
    placed: list[StepView] = []
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


def _attempt_duration(attempt: AttemptView | None, now_ms: int) -> int | None:
    if attempt is None or attempt.started_at_ms is None:
        return None
    end = attempt.ended_at_ms if attempt.ended_at_ms is not None else now_ms
    return end - attempt.started_at_ms


def _result(step: StepView, attempt: AttemptView | None) -> str:
    parts = []
    # a step waiting for its retry has no code of its own: its failed Attempt's says why
    code = step.result_code or (attempt.result_code if attempt else None)
    if code:
        parts.append(code_text(code))
    if attempt is not None and attempt.signal:
        parts.append(attempt.signal)  # "SIGTERM", not "exit -15"
    elif attempt is not None and attempt.exit_code is not None:
        parts.append(f"exit {attempt.exit_code}")
    if attempt is not None and attempt.error:
        parts.append(attempt.error)
    return ", ".join(parts) or "-"


def events_table(records: Sequence[Record], now_ms: int, *, more: bool = False) -> Table:
    """One row per event, as given (newest first from `events`)."""
    hint = " (more: --limit N, --all, --before POSITION)" if more else ""
    table = Table(title=f"{len(records)} event(s){hint}", title_justify="left")
    for column in ("pos", "at", "stream", "ver", "type", "data"):
        table.add_column(column, overflow="fold", no_wrap=column == "at")
    for record in records:
        table.add_row(*event_row(record, now_ms))
    return table


def event_row(record: Record, now_ms: int) -> tuple[str, ...]:
    """The cells of one event: position, time, stream, version, type, summary."""
    return (
        str(record.global_position),
        when(record.metadata.get("at_ms"), now_ms),
        record.stream_id,
        str(record.stream_version),
        record.type,
        event_summary(record),
    )


_SUMMARY_SKIP = {"plan", "revision", "publication", "admission", "output", "execution"}


def event_summary(record: Record) -> str:
    """A one-line summary of an event's data (big documents left out)."""
    parts = []
    for key, value in record.data.items():
        if key in _SUMMARY_SKIP or value is None:
            continue
        if isinstance(value, (dict, list)):
            continue
        if key.endswith("_code") and isinstance(value, str):
            value = code_text(value)
        parts.append(f"{key}={value}")
    ran = execution_rules.split(record.data)[1] if "output" in record.data else None
    if ran and ran.get("signal"):
        parts.append(f"signal={ran['signal']}")
    elif ran and ran.get("exit_code") is not None:
        parts.append(f"exit_code={ran['exit_code']}")
    return " ".join(parts)


def cycle_table(result: CycleResult) -> Table | Group:
    """The counters of each phase of a cycle, and its errors."""
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


def cycle_document(result: CycleResult) -> dict[str, Any]:
    """The cycle as JSON: a document of counters per phase."""
    return {phase: jsonable(getattr(result, phase)) for phase in PHASES}


def rebuild_table(summary: RebuildSummary) -> Group:
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
