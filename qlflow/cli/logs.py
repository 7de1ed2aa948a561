"""The command line's logging: `-v` levels on stderr, and catching the last warning a
library logs (the connection pool's reason for failing) instead of printing each."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

_verbosity = 0  # set by the global options; -vv shows the traceback of an internal error


def configure(verbose: int) -> None:
    """Log to stderr: warnings only, -v info, -vv debug."""
    global _verbosity
    _verbosity = verbose
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="qlflow: %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def use_json() -> None:
    """Log to stderr as one JSON object per line, info and up (-vv: debug too): a
    host's events (`qlflow.event_log`) and every other message alike."""
    from qlflow.event_log import JsonFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    level = logging.DEBUG if _verbosity > 1 else logging.INFO
    logging.basicConfig(level=level, handlers=[handler], force=True)


def verbosity() -> int:
    """How many -v the command line was given."""
    return _verbosity


class LastWarning(logging.Handler):
    """Keeps the message of the last warning (or worse) it was handed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()


@contextlib.contextmanager
def last_warning_of(logger_name: str) -> Iterator[LastWarning]:
    """Catch the warnings of one logger (printing them only with -v); the handler
    yielded holds the last one."""
    logger = logging.getLogger(logger_name)
    caught = LastWarning()
    logger.addHandler(caught)
    propagate, logger.propagate = logger.propagate, _verbosity > 0
    try:
        yield caught
    finally:
        logger.removeHandler(caught)
        logger.propagate = propagate
