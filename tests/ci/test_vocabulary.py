"""One vocabulary: event types, statuses and stream prefixes are spelled in their own
module only (docs/DESIGN.md, "Vocabulary").

The scan reads the syntax tree, so a reformat cannot hide a literal: any string
constant (docstrings aside) of the product's packages that equals an event type, a
status word or a stream prefix outside the module that declares it fails, and so does
an f-string that builds an event type or a stream id from a spelled prefix.
Phases and bare stream categories ("run", "schedule", "admission") are not scanned:
the same words are field names in the log's data.
"""

from __future__ import annotations

import ast
from enum import StrEnum
from pathlib import Path

import pytest

from domain import event_types, phases, streams, transitions

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("domain", "eventstore", "projections", "actors", "qlflow")

EVENT_TYPES = frozenset(event_types.known())
STATUSES = frozenset(transitions.Status)
PREFIXES = frozenset(streams.prefix(category) for category in streams.CATEGORIES)
FAMILY_DOTS = frozenset(f"{family}." for family in event_types.Family)
HOMES = {
    "domain/event_types.py": EVENT_TYPES | FAMILY_DOTS,
    "domain/transitions.py": STATUSES,
    "domain/streams.py": PREFIXES,
}


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of docstring constants and of `__all__`'s names (a module may be called
    `running`)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            found |= {id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant)}
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled_words(source: str, relative: str) -> list[str]:
    """Every hand-spelled vocabulary word in `source` (a module at `relative`)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    in_fstring = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                built = [p for p in PREFIXES | FAMILY_DOTS if head.value == p]
                home = (
                    "domain/streams.py"
                    if built and built[0] in PREFIXES
                    else "domain/event_types.py"
                )
                if built and relative != home:
                    found.append(f"{relative}:{node.lineno}: f-string builds from {head.value!r}")
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in docstrings or id(node) in in_fstring:
            continue
        for home, words in HOMES.items():
            if relative != home and node.value in words:
                found.append(f"{relative}:{node.lineno}: {node.value!r} belongs to {home}")
    return found


def test_no_module_spells_a_word_of_the_vocabulary():
    found = []
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        found += spelled_words(path.read_text(), relative)
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        'if record.type == "attempt.claimed": pass',
        'status = "failed"',
        'stream = f"run-{run_id}"',
        'kind = f"step.{to_status}"',
        'PREFIXES = ("lease-",)',
    ],
)
def test_the_scan_finds_a_spelled_word(source):
    assert spelled_words(source, "projections/example.py") != []


def test_docstrings_and_messages_are_not_words():
    source = '"""Folds attempt.claimed."""\nmessage = f"the step failed: {why}"\n'
    assert spelled_words(source, "projections/example.py") == []


@pytest.mark.parametrize(
    "vocabulary", [event_types.EventType, event_types.Family, transitions.Status]
)
def test_each_word_is_declared_once(vocabulary: type[StrEnum]):
    values = [member.value for member in vocabulary]
    assert len(values) == len(set(values)) == len(vocabulary.__members__)


def test_no_name_means_two_things_across_the_vocabulary_modules():
    seen: dict[str, tuple[str, object]] = {}
    clashes = []
    for module in (event_types, transitions, phases, streams):
        for name, value in vars(module).items():
            if not name.isupper() or not isinstance(value, str):
                continue
            if name in seen and seen[name][1] != value:
                clashes.append(
                    f"{name}: {seen[name][0]}={seen[name][1]!r}, {module.__name__}={value!r}"
                )
            seen.setdefault(name, (module.__name__, value))
    assert clashes == []
