"""Reading package folders and manifest dicts (qlflow/packages.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from domain.errors import ManifestError
from domain.tasks import task_source_digest
from qlflow.packages import (
    MAX_TASK_FILE_BYTES,
    TaskFileError,
    file_digest,
    load,
    load_package,
    package_from_manifest,
    task_file_digest,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nightly"


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A private copy of the SPEC §11 example package."""
    folder = tmp_path / "nightly"
    shutil.copytree(EXAMPLE, folder)
    return folder


def test_example_package_loads_with_file_digests(package: Path) -> None:
    loaded = load(package)
    expected = "sha256:" + hashlib.sha256((package / "fetch.py").read_bytes()).hexdigest()
    assert dict(loaded.file_digests) == {"fetch.py": expected}
    assert loaded.publisher == "acme"
    assert loaded.source == str(package / "qlflow.toml")
    revision = loaded.revision
    assert (revision.package, revision.installation, revision.project) == (
        "backup",
        "backup",
        "default",
    )
    assert sorted(revision.tasks) == ["archive", "fetch"]
    fetch = revision.tasks["fetch"]
    assert fetch.source_digest == task_source_digest(fetch.definition(), {"fetch.py": expected})
    workflow = revision.workflow("nightly")
    assert workflow.timeout_ms == 600000
    assert [(s.key, s.needs) for s in workflow.steps] == [("fetch", ()), ("archive", ("fetch",))]


def test_manifest_path_and_folder_give_the_same_revision(package: Path) -> None:
    assert load(package / "qlflow.toml").revision == load(str(package)).revision


def test_editing_a_named_file_changes_only_that_tasks_digest(package: Path) -> None:
    before = load(package).revision
    (package / "fetch.py").write_text("print('changed')\n", encoding="utf-8")
    after = load(package).revision
    assert after.tasks["fetch"].source_digest != before.tasks["fetch"].source_digest
    assert after.tasks["archive"].source_digest == before.tasks["archive"].source_digest
    assert after.lock_digest != before.lock_digest


def test_files_not_named_do_not_change_the_revision(package: Path) -> None:
    before = load(package).revision
    (package / "README.txt").write_text("notes\n", encoding="utf-8")
    assert load(package).revision == before


def test_missing_named_file_is_refused_naming_it(package: Path) -> None:
    (package / "fetch.py").unlink()
    with pytest.raises(ManifestError) as caught:
        load(package)
    assert str(caught.value) == (
        f"{package / 'qlflow.toml'}: [tasks.fetch] files: file 'fetch.py' does not exist"
    )


def test_named_directory_is_refused(package: Path) -> None:
    (package / "fetch.py").unlink()
    (package / "fetch.py").mkdir()
    with pytest.raises(ManifestError, match=r"\[tasks.fetch\] files: 'fetch.py' is not a regular"):
        load(package)


def test_symlink_leading_outside_the_package_is_refused(package: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("x", encoding="utf-8")
    (package / "fetch.py").unlink()
    os.symlink(secret, package / "fetch.py")
    with pytest.raises(ManifestError, match="leads outside the package folder"):
        load(package)


@pytest.mark.parametrize("swap", ["symlink to /dev/zero", "a pipe", "too large"])
def test_files_that_are_not_plain_bounded_files_in_the_folder_are_refused(
    package: Path, swap: str
) -> None:
    (package / "fetch.py").unlink()
    if swap == "symlink to /dev/zero":
        os.symlink("/dev/zero", package / "fetch.py")
        expected = "leads outside the package folder"
    elif swap == "a pipe":
        os.mkfifo(package / "fetch.py")
        expected = "is not a regular file"
    else:
        with open(package / "fetch.py", "wb") as handle:
            handle.truncate(MAX_TASK_FILE_BYTES + 1)
        expected = "is larger than 64 MiB"
    with pytest.raises(ManifestError, match=rf"\[tasks.fetch\] files: 'fetch.py' .*{expected}"):
        load(package)


def test_the_checks_are_one_function_with_a_bounded_cancellable_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * (3 << 20))
    assert task_file_digest(tmp_path, "f") == file_digest(tmp_path / "f")
    with pytest.raises(TaskFileError) as too_large:
        task_file_digest(tmp_path, "f", max_bytes=1 << 20)
    assert too_large.value.problem == "too_large"
    with pytest.raises(TaskFileError) as cancelled:
        task_file_digest(tmp_path, "f", cancelled=lambda: True)
    assert cancelled.value.problem == "cancelled"
    (tmp_path / "inner").symlink_to(tmp_path / "f")  # a symlink inside the folder is fine
    assert task_file_digest(tmp_path, "inner") == file_digest(tmp_path / "f")


def test_folder_without_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"qlflow.toml: no qlflow.toml here"):
        load_package(tmp_path)


def test_manifest_that_is_not_utf8_is_refused(package: Path) -> None:
    (package / "qlflow.toml").write_bytes(b'[package]\nname = "\xff"\n')
    with pytest.raises(ManifestError, match="not UTF-8 text"):
        load(package)


def test_syntax_error_names_the_file_and_line(package: Path) -> None:
    text = (package / "qlflow.toml").read_text(encoding="utf-8")
    (package / "qlflow.toml").write_text(text + "\n[tasks.broken\n", encoding="utf-8")
    with pytest.raises(ManifestError) as caught:
        load(package)
    message = str(caught.value)
    assert message.startswith(f"{package / 'qlflow.toml'}: TOML syntax error:")
    assert f"line {len(text.splitlines()) + 2}" in message


def test_dict_manifest_with_digests_matches_the_folder(package: Path) -> None:
    folder = load(package)
    as_dict = package_from_manifest(
        {
            "package": {"name": "backup", "publisher": "acme"},
            "tasks": {
                "fetch": {
                    "command": ["python3", "fetch.py"],
                    "files": {"fetch.py": file_digest(package / "fetch.py")},
                },
                "archive": {"command": ["sh", "-c", "tar czf out.tgz data"]},
            },
            "workflows": {
                "nightly": {
                    "timeout_ms": 600000,
                    "steps": [
                        {"key": "fetch", "task": "fetch"},
                        {"key": "archive", "task": "archive", "needs": ["fetch"]},
                    ],
                }
            },
        }
    )
    assert as_dict.folder is None
    assert as_dict.revision == folder.revision


def test_load_refuses_other_types() -> None:
    with pytest.raises(ManifestError, match="a package folder path or a manifest dict, not int"):
        load(42)
