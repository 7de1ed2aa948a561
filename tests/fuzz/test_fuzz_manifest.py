"""Fuzzing `qlflow.toml` parsing and manifest validation (SPEC §11): whatever the
input, the answer is a Manifest or a `ManifestError` — never another exception."""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from domain.errors import ManifestError
from domain.manifest import Manifest, parse_manifest, revision_from_manifest, validate_manifest
from tests.fuzz.support import FUZZ, VALID_MANIFEST, hostile, mutated, nasty_text, to_toml

VALID_TOML = to_toml(VALID_MANIFEST)
TOML_PIECES = [
    "[",
    "]",
    "=",
    '"',
    "{",
    "}",
    ",",
    "\n",
    "[[tasks]]",
    "x = 1\n",
    "'''",
    "#",
    "\\u0000",
    "x = " + "[" * 1500,
    "y = " + "{ a = " * 800,  # nesting deeper than any parser recursion
]


def _parse_or_refuse(text: str, folder: bool) -> Manifest | None:
    try:
        manifest = parse_manifest(text, folder=folder)
    except ManifestError as error:
        assert str(error), "a refusal says what was wrong"
        return None
    assert isinstance(manifest, Manifest)
    return manifest


def _validate_or_refuse(raw: object, folder: bool) -> Manifest | None:
    try:
        manifest = validate_manifest(raw, folder=folder)  # type: ignore[arg-type]
    except ManifestError as error:
        assert str(error)
        return None
    with contextlib.suppress(ManifestError):  # materializing may refuse too, but only so
        revision_from_manifest(manifest)
    return manifest


def test_the_seed_manifest_is_valid() -> None:
    """The fuzzers mutate a manifest that is valid as written (else they test nothing)."""
    manifest = parse_manifest(VALID_TOML)
    assert [w.key for w in manifest.workflows] == ["nightly", "quick"]
    assert validate_manifest(VALID_MANIFEST).package.name == "backup"


@st.composite
def edited_text(draw: st.DrawFn) -> str:
    """The valid TOML with a few character- or line-level edits."""
    text = VALID_TOML
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "delete", "duplicate_line", "drop_line"]))
        lines = text.splitlines(keepends=True)
        if kind == "insert":
            at = draw(st.integers(0, len(text)))
            piece = draw(nasty_text | st.sampled_from(TOML_PIECES))
            text = text[:at] + piece + text[at:]
        elif kind == "delete" and text:
            start = draw(st.integers(0, len(text) - 1))
            text = text[:start] + text[start + draw(st.integers(1, 12)) :]
        elif kind == "duplicate_line" and lines:
            at = draw(st.integers(0, len(lines) - 1))
            lines.insert(at, lines[at])
            text = "".join(lines)
        elif lines:
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "".join(lines)
    return text


@FUZZ
@given(text=edited_text(), folder=st.booleans())
def test_edited_toml_parses_or_raises_manifest_error(text: str, folder: bool) -> None:
    _parse_or_refuse(text, folder)


@FUZZ
@given(text=st.text(max_size=300), folder=st.booleans())
def test_arbitrary_text_parses_or_raises_manifest_error(text: str, folder: bool) -> None:
    _parse_or_refuse(text, folder)


@FUZZ
@given(document=mutated(VALID_MANIFEST), folder=st.booleans())
def test_mutated_manifest_toml_parses_or_raises_manifest_error(document, folder: bool) -> None:
    try:
        text = to_toml(document)
    except TypeError:
        return  # a value TOML cannot hold (None, a float): that is no manifest text
    _parse_or_refuse(text, folder)


@FUZZ
@given(document=mutated(VALID_MANIFEST, max_changes=6), folder=st.booleans())
def test_mutated_manifest_dicts_validate_or_raise_manifest_error(document, folder: bool) -> None:
    _validate_or_refuse(document, folder)


manifest_like = st.fixed_dictionaries(
    {},
    optional={
        "package": st.dictionaries(
            st.sampled_from(["name", "publisher", "project", "installation", "x"]),
            hostile,
            max_size=5,
        )
        | hostile,
        "tasks": st.dictionaries(nasty_text | st.integers(), hostile, max_size=3) | hostile,
        "workflows": st.dictionaries(nasty_text | st.integers(), hostile, max_size=3) | hostile,
    },
)


@FUZZ
@given(raw=manifest_like | hostile, folder=st.booleans())
def test_random_dicts_validate_or_raise_manifest_error(raw, folder: bool) -> None:
    _validate_or_refuse(raw, folder)
