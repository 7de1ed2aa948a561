"""What the fuzzers share: the example budget, hostile values, structural mutation
of a valid document, and a small TOML writer for manifests.

Budget: 100 examples per fuzzer (the CI budget), scaled like every property's by
`QLFLOW_FUZZ_EXAMPLES` for a longer hunt (tests/hypothesis_budget.py), e.g.
`QLFLOW_FUZZ_EXAMPLES=5000`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.hypothesis_budget import examples

EXAMPLES = examples(100)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Text that stresses encoders and parsers: NUL, lone surrogates, RTL, emoji, quotes.
nasty_text = st.text(
    alphabet=st.characters(codec=None, categories=None, blacklist_categories=()),
    max_size=40,
) | st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "\ud800",
        "a\udfffb",
        "\u202e",
        "💥",
        '"',
        "'",
        "\\",
        "\n",
        "..",
        "/",
        "a" * 5000,
        "run-",
        "pub:",
        "sha256:" + "0" * 64,
    ]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | nasty_text
    | st.binary(max_size=16)
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | nasty_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(nasty_text, children, max_size=4)
    ),
    max_leaves=24,
)
# any Python value an API caller could pass by mistake
hostile = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.frozensets(st.integers() | st.text(max_size=4), max_size=3)
        | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
) | st.builds(object)


@st.composite
def mutated(draw: st.DrawFn, document: Any, max_changes: int = 4) -> Any:
    """`document` with 1..max_changes random changes anywhere in its tree: a value
    replaced by a hostile one or by a very deep nesting, a key or item removed or
    added, a key renamed (to any hashable a Python caller could use)."""
    result = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, max_changes))):
        container: Any = result
        while True:
            if not isinstance(container, (dict, list)) or not container:
                break
            keys = list(container) if isinstance(container, dict) else list(range(len(container)))
            key = draw(st.sampled_from(keys))
            child = container[key]
            if isinstance(child, (dict, list)) and child and draw(st.booleans()):
                container = child
                continue
            _change(draw, container, key)
            break
    return result


def _change(draw: st.DrawFn, container: Any, key: Any) -> None:
    action = draw(st.sampled_from(["replace", "delete", "add", "rekey", "nest"]))
    if action == "replace":
        container[key] = draw(json_values)
    elif action == "delete":
        del container[key]
    elif action == "nest":
        depth = draw(st.integers(1, 1500))  # deeper than a recursive parser copes with
        leaf: Any = draw(st.sampled_from([[], {}, "x", 1]))
        for _ in range(depth):
            leaf = [leaf] if draw(st.booleans()) else {"a": leaf}
        container[key] = leaf
    elif isinstance(container, list):
        container.insert(key, draw(json_values))
    elif action == "add":
        container[draw(any_key)] = draw(json_values)
    else:
        container[draw(any_key)] = container.pop(key)


# a dict built in Python (not parsed from TOML or JSON) may have any hashable keys
any_key = nasty_text | st.integers() | st.none() | st.tuples(st.integers()) | st.booleans()


def to_toml(document: dict[str, Any]) -> str:
    """Write a dict as TOML: plain keys first, then a `[table]` per nested dict; values
    as strings, numbers, booleans, arrays and inline tables (JSON escapes are valid
    TOML basic-string escapes). TypeError for what TOML cannot hold (None, bytes)."""
    lines: list[str] = []
    _table(lines, [], document)
    return "\n".join(lines) + "\n"


def _table(lines: list[str], path: list[str], table: dict[str, Any]) -> None:
    if path:
        lines.append("[" + ".".join(_key(part) for part in path) + "]")
    nested = {k: v for k, v in table.items() if isinstance(v, dict)}
    lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items() if k not in nested]
    for key, value in nested.items():
        _table(lines, [*path, key], value)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"a TOML key is a string, not {key!r}")
    return key if key.replace("_", "").replace("-", "").isalnum() and key.isascii() else _value(key)


def _value(value: Any) -> str:
    # nesting is unrolled first, so a 600-deep value does not exhaust our own stack
    opening, closing = [], []
    while isinstance(value, (list, dict)) and len(value) == 1:
        if isinstance(value, list):
            opening.append("[")
            closing.append("]")
            value = value[0]
        else:
            [(key, value)] = value.items()
            opening.append("{ " + _key(key) + " = ")
            closing.append(" }")
    return "".join(opening) + _flat_value(value) + "".join(reversed(closing))


def _flat_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(value), repr(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join([_value(v) for v in value]) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join([f"{_key(k)} = {_value(v)}" for k, v in value.items()]) + " }"
    raise TypeError(f"no TOML for {value!r}")


VALID_MANIFEST: dict[str, Any] = {
    "package": {"name": "backup", "publisher": "acme"},
    "tasks": {
        "fetch": {"command": ["python3", "fetch.py"], "env": {"MODE": "full"}},
        "archive": {"command": ["sh", "-c", "tar czf out.tgz data"], "enabled": True},
        "notify": {"command": ["true"]},
    },
    "workflows": {
        "nightly": {
            "timeout_ms": 600000,
            "steps": [
                {"key": "fetch", "task": "fetch"},
                {"key": "archive", "task": "archive", "needs": ["fetch"]},
                {"key": "notify", "task": "notify", "needs": ["fetch", "archive"]},
            ],
        },
        "quick": {"steps": [{"key": "only", "task": "notify"}], "enabled": True},
    },
}
