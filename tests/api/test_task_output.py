"""A task's output file is read as the API reads an output: what the API refuses
(an integer past 64 bits) the file may not turn into something else (a float)."""

from __future__ import annotations

import pytest

from domain.errors import InvalidInput
from domain.json_values import check_output_size
from qlflow.executor.task_io import OutputInvalid, read_output


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**30])
def test_an_integer_past_64_bits_is_refused_like_the_api_refuses_it(tmp_path, value):
    path = tmp_path / "out.json"
    path.write_text(f'{{"n": {value}}}')

    with pytest.raises(OutputInvalid, match="64 bits"):
        read_output(path)
    with pytest.raises(InvalidInput):
        check_output_size({"n": value}, "output")


@pytest.mark.parametrize("value", [2**64 - 1, -(2**63), 0, 12])
def test_integers_within_64_bits_stay_integers(tmp_path, value):
    path = tmp_path / "out.json"
    path.write_text(f'{{"n": {value}, "f": 1.5e30}}')

    output = read_output(path)

    assert output == {"n": value, "f": 1.5e30}
    assert type(output["n"]) is int


@pytest.mark.parametrize("text", ["[1]", '{"a": NaN}', '{"a": 1', "\xff"])
def test_what_is_no_output_is_refused(tmp_path, text):
    path = tmp_path / "out.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(OutputInvalid):
        read_output(path)
