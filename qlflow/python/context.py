"""What a python Task's function receives: `qlflow.TaskContext`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.params import ParamValue

LogSink = Callable[[str, bytes], None]
"""Where the function's log lines go: (stream, bytes) to the Attempt's stored log."""

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True, slots=True)
class TaskContext:
    """The one argument of a python Task's function.

    `params`: the Run's bound parameters; `needs`: each needed step's output (None
    for a step that returned none); `attempt` is 1-based, of at most `max_attempts`;
    `log` is a `logging.Logger` whose lines go to the step's stored log;
    `stop_requested()` turns true once the Run has cancel intent or the host drains:
    a long function should look at it and return (in a pool process it is ended
    after a grace anyway). `traceparent` is the Run's W3C trace context (what a
    command gets as TRACEPARENT), so the function's spans join the Run's trace."""

    params: Mapping[str, ParamValue]
    needs: Mapping[str, dict[str, Any] | None]
    run_id: str
    step_key: str
    attempt: int
    max_attempts: int
    attempt_id: str
    log: logging.Logger
    _stop: Callable[[], bool] = field(repr=False)
    traceparent: str = ""

    def trace_headers(self) -> dict[str, str]:
        """The Run's W3C trace context as carrier headers, for
        `opentelemetry.propagate.extract(ctx.trace_headers())`."""
        return {"traceparent": self.traceparent}

    def stop_requested(self) -> bool:
        """Whether the function has been asked to stop."""
        return self._stop()


class _SinkHandler(logging.Handler):
    def __init__(self, sink: LogSink) -> None:
        super().__init__(logging.DEBUG)
        self._sink = sink
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            self._sink(
                "stderr" if record.levelno >= logging.WARNING else "stdout",
                (line + "\n").encode("utf-8", "replace"),
            )
        except Exception:  # a log line must never fail the step
            self.handleError(record)


def task_logger(step_key: str, sink: LogSink) -> logging.Logger:
    """A logger of one Attempt: not registered with `logging` (two Attempts of the same
    step never share one), every level, its lines to `sink` only."""
    logger = logging.Logger(f"qlflow.task.{step_key}", logging.DEBUG)
    logger.propagate = False
    logger.addHandler(_SinkHandler(sink))
    return logger
