"""A python Task's target `module.path:function`, checked without reading anything."""

from __future__ import annotations

import keyword

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.errors import PlanError
from domain.python_tasks import files_problem, module_file, parse_target, target_problem

IDENTIFIERS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name)
)


@given(st.lists(IDENTIFIERS, min_size=1, max_size=4), IDENTIFIERS)
def test_a_dotted_module_and_a_function_parse_and_name_their_files(
    parts: list[str], function: str
) -> None:
    text = ".".join(parts) + ":" + function
    target = parse_target(text)
    assert (target.text, target.function) == (text, function)
    plain, package = target.module_files()
    assert plain == "/".join(parts) + ".py" and package == "/".join(parts) + "/__init__.py"
    assert module_file(target, [package, "other.py"]) == package
    assert files_problem(target, [plain]) is None
    assert files_problem(target, ["other.py"]) is not None


@given(st.text(max_size=40))
def test_anything_else_is_refused_with_a_reason(text: str) -> None:
    problem = target_problem(text)
    if problem is None:
        module, function = text.split(":")
        assert all(part.isidentifier() for part in [*module.split("."), function])
        assert "/" not in text and ".." not in text
    else:
        with pytest.raises(PlanError, match="python"):
            parse_target(text)


@pytest.mark.parametrize(
    "text", ["../x:y", "/abs/x:y", "C:/x:y", "a..b:c", "a.b", "a:b:c", ":f", "m:", "m:1f",
             "for.x:y", "m:class", "é.x:y"],
)  # fmt: skip
def test_paths_out_of_the_folder_and_bad_identifiers_are_refused(text: str) -> None:
    assert target_problem(text) is not None
