"""Exit statuses of the command line, and which error maps to which.

0 ok (for `run`: the Run succeeded); 1 the Run failed (or `verify` found
differences, or the cycle cannot converge, or an internal error); 2 bad input (any
qlflow error, a missing path, a bad `--db`, a missing store or a file that is not
one); 3 the Run was cancelled; 4 it timed out; 5 the store is unavailable right now
(unreachable, busy, disk full, read-only: try again later); 130 interrupted without
waiting.
"""

from __future__ import annotations

import sys

from domain.errors import CorruptionError, QlflowError, StoreUnavailable
from domain.transitions import Status
from qlflow.driver import CycleFailing

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_CANCELLED = 3
EXIT_TIMED_OUT = 4
EXIT_UNAVAILABLE = 5
EXIT_INTERRUPTED = 130
RUN_EXIT_CODES = {
    Status.SUCCEEDED.value: EXIT_OK,
    Status.FAILED.value: EXIT_FAILED,
    Status.CANCELLED.value: EXIT_CANCELLED,
    Status.TIMED_OUT.value: EXIT_TIMED_OUT,
}


class CliError(Exception):
    """A problem the command line reports as one line, with an exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_of(error: BaseException) -> int | None:
    """The exit status for an error the command line reports as one line (its
    message), or None for an error it does not expect (an internal error)."""
    if isinstance(error, CliError):
        return error.exit_code
    if isinstance(error, (CorruptionError, CycleFailing)):
        return EXIT_FAILED
    if isinstance(error, StoreUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(error, (QlflowError, OSError)):
        return EXIT_BAD_INPUT
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return None


def message_of(error: BaseException) -> str:
    """What the one line says about an expected error."""
    if isinstance(error, KeyboardInterrupt):
        return Status.INTERRUPTED
    if isinstance(error, OSError) and not isinstance(error, QlflowError):
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror or error}{where}"
    return str(error)


def error_line(message: str) -> None:
    """`qlflow: error: <message>` on stderr, on one line."""
    text = " ".join(str(message).split())
    sys.stderr.write(f"qlflow: error: {text}\n")
    sys.stderr.flush()
