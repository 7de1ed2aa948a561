"""Where the command line writes: rich consoles for people, orjson documents for
machines (`--json`)."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console


def stdout_console() -> Console:
    """The console for results (markup off, as for stderr). Piped output is not cut
    at 80 columns: a log path or an id stays whole on one line (COLUMNS wins if set)."""
    console = Console(highlight=False, markup=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, markup=False, width=200)
    return console


def stderr_console() -> Console:
    """The console for notices and errors."""
    # markup off: ids, paths and messages print as they are, brackets included
    return Console(stderr=True, highlight=False, markup=False)


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
