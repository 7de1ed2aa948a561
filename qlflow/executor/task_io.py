"""Files the local executor hands a task: QLFLOW_INPUTS (its parameters and the
outputs of the steps it needs) and QLFLOW_OUTPUT (where it may write its own
output, a JSON object of at most 64 KiB), plus one QLFLOW_PARAM_<NAME> per
parameter."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson

from domain.errors import InvalidInput
from domain.json_values import MAX_OUTPUT_BYTES, check_finite, check_output_size
from domain.params import env_name
from projections.task_io import TaskInputs

OUTPUT_INVALID = "output_invalid"  # the task wrote an output that is not a JSON object


class OutputInvalid(Exception):
    """What the task wrote to QLFLOW_OUTPUT cannot be its output."""


def task_environment(inputs: TaskInputs, inputs_path: Path, output_path: Path) -> dict[str, str]:
    """The variables for one Attempt; writes the inputs file (and clears an old output)."""
    inputs_path.parent.mkdir(parents=True, exist_ok=True)
    inputs_path.write_bytes(orjson.dumps(inputs, option=orjson.OPT_SORT_KEYS))
    output_path.unlink(missing_ok=True)
    env = {"QLFLOW_INPUTS": str(inputs_path), "QLFLOW_OUTPUT": str(output_path)}
    for name, value in inputs["params"].items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        env[env_name(name)] = text
    return env


_MIN_INTEGER, _MAX_INTEGER = -(2**63), 2**64 - 1  # what the store's JSON encoder can hold


def _integer(text: str) -> int:
    value = int(text)
    if not _MIN_INTEGER <= value <= _MAX_INTEGER:
        raise ValueError(f"the integer {text[:40]} does not fit in 64 bits")
    return value


def read_output(path: Path) -> dict[str, Any] | None:
    """The JSON object the task wrote, None when it wrote nothing (no file, or an empty
    one); OutputInvalid when it cannot be an output."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return None
    except OSError as error:
        raise OutputInvalid(f"QLFLOW_OUTPUT cannot be read: {error}") from None
    if size == 0:
        return None
    if size > MAX_OUTPUT_BYTES:
        raise OutputInvalid(f"QLFLOW_OUTPUT is {size} bytes; at most {MAX_OUTPUT_BYTES}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_OUTPUT_BYTES + 1)
        # the stdlib parser, for its integer hook: orjson would read an integer past
        # 64 bits as a float, silently, where the API refuses the same value
        value = json.loads(data, parse_int=_integer)
    except (OSError, ValueError) as error:
        raise OutputInvalid(f"QLFLOW_OUTPUT is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise OutputInvalid("QLFLOW_OUTPUT must hold a JSON object")
    try:
        check_finite(value, "output")
        check_output_size(value, "output")
    except InvalidInput as error:
        raise OutputInvalid(str(error)) from None
    return value
