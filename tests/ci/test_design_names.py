"""docs/DESIGN.md says what the code does: every module file and every dotted name it
names in backticks (`domain/work.py`, `domain.work.instants`) exists, so a rename or a
removal that leaves the design behind fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
PACKAGES = ("domain", "eventstore", "projections", "actors", "qlflow", "bench")
CODE = re.compile(r"`([^`\s]+)`")
# names that read like ours but are something else: a user's module in an example
NOT_OURS = ("etl/", "qlflow.toml")


def named(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for token in CODE.findall(DESIGN.read_text()):
        token = token.removesuffix("()").rstrip(".,:;")
        if token.startswith(NOT_OURS) or not token.startswith(PACKAGES):
            continue
        if pattern.fullmatch(token):
            found.append(token)
    return sorted(set(found))


def resolves(dotted: str) -> bool:
    """Whether `dotted` is a module, or an attribute path inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_every_module_file_the_design_names_exists() -> None:
    files = named(re.compile(r"[\w/]+\.py"))
    assert len(files) > 50  # the scan reads the design, not nothing
    missing = [path for path in files if not (ROOT / path).is_file()]
    assert not missing, f"docs/DESIGN.md names files that do not exist: {missing}"


def test_every_dotted_name_the_design_names_exists() -> None:
    names = named(re.compile(r"[a-z_]+(\.[A-Za-z_]\w*)+"))
    assert len(names) > 5
    missing = [name for name in names if not resolves(name)]
    assert not missing, f"docs/DESIGN.md names what does not exist: {missing}"


def test_every_section_names_the_modules_it_describes() -> None:
    """Each top-level section of the design names at least one module, file or name of
    ours (its subsections may lean on it), so a reader can go from prose to code."""
    sections = re.split(r"^## ", DESIGN.read_text(), flags=re.M)[1:]
    assert len(sections) > 20
    silent = [
        section.splitlines()[0]
        for section in sections
        if not any(token.startswith(PACKAGES) for token in CODE.findall(section))
    ]
    assert not silent, f"docs/DESIGN.md sections that name no module of ours: {silent}"
