"""Files the local executor hands a task: QLFLOW_INPUTS (its parameters and the
outputs of the steps it needs) and QLFLOW_OUTPUT (where it may write its own
output, a JSON object of at most 64 KiB), plus one QLFLOW_PARAM_<NAME> per
parameter."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from domain.errors import InvalidInput
from domain.json_values import MAX_OUTPUT_BYTES, check_finite, check_output_size
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
        env[f"QLFLOW_PARAM_{name.upper()}"] = text
    return env


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
            value = orjson.loads(handle.read(MAX_OUTPUT_BYTES + 1))
    except (OSError, orjson.JSONDecodeError) as error:
        raise OutputInvalid(f"QLFLOW_OUTPUT is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise OutputInvalid("QLFLOW_OUTPUT must hold a JSON object")
    try:
        check_finite(value, "output")
        check_output_size(value, "output")
    except InvalidInput as error:
        raise OutputInvalid(str(error)) from None
    return value
