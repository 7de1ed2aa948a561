"""Live progress: of one Run while `qlflow run` drives it, and of a replay of the log
(`rebuild`, `verify`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from projections.rebuild import Progress as ReplayProgress
from projections.views import RunView
from qlflow.cli.output import stderr_console
from qlflow.cli.retry_words import waiting_retry
from qlflow.cli.tables import code_text, status_text, steps_table
from qlflow.cli.times import clock
from qlflow.clock import wall_clock_ms


class RunProgress:
    """Live progress of one Run: a rich Live table on a terminal, else one line per
    step status change (readable in CI logs and pipes)."""

    def __init__(self, console: Console, run_id: str, enabled: bool = True) -> None:
        self.console = console
        self.run_id = run_id
        self.enabled = enabled
        self.live_mode = enabled and console.is_terminal
        self._live: Live | None = None
        self._seen: dict[str, tuple[str, int, bool]] = {}
        self.notices: list[str] = []
        self._lock = threading.Lock()

    def __enter__(self) -> RunProgress:
        if self.live_mode:
            self._live = Live(
                Text(f"run {self.run_id}: starting"),
                console=self.console,
                refresh_per_second=8,
                transient=True,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def notice(self, message: str) -> None:
        """A line for the user (shown above the live table, or printed)."""
        with self._lock:
            self.notices.append(message)

    def update(self, run: RunView) -> None:
        """Show the Run as it is now (and any notices since the last update)."""
        with self._lock:
            notices, self.notices = self.notices, []
        for message in notices:
            stderr_console().print(message)
        if not self.enabled:
            return
        if self._live is not None:
            done = run.step_count - run.open_steps
            title = Text.assemble(
                f"run {run.run_id} ",
                status_text(run.status),
                f"  {done} of {run.step_count} steps done",
            )
            if run.cancel_requested_at_ms is not None:
                title.append(f"  cancelling ({run.cancel_reason})", style="yellow")
            self._live.update(Group(title, steps_table(run, detail=False)), refresh=True)
            return
        now_ms = wall_clock_ms()
        for step in run.steps.values():
            attempt = step.attempts[-1] if step.attempts else None
            retry = waiting_retry(step, now_ms)
            state = (step.status, attempt.attempt_number if attempt else 0, bool(retry))
            if self._seen.get(step.step_key) != state:
                self._seen[step.step_key] = state
                said = [f"attempt {state[1]}"] if attempt else []
                if retry and attempt is not None:
                    said = [f"attempt {state[1]} {attempt.status}", retry]
                if step.result_code:
                    said.append(code_text(step.result_code))
                words = f" ({', '.join(said)})" if said else ""
                status = step.status.replace("_", " ")
                self.console.print(f"{clock(now_ms)}  {step.step_key}: {status}{words}")


@contextlib.contextmanager
def replay_progress(what: str, *, enabled: bool) -> Iterator[ReplayProgress | None]:
    """A progress bar for a replay of the log, on a terminal; None elsewhere."""
    console = stderr_console()
    if not (enabled and console.is_terminal):
        yield None
        return
    with Progress(
        TextColumn(what), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
