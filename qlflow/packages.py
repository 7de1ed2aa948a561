"""Reading packages: a folder with `qlflow.toml`, or a manifest dict.

This is the I/O half of packaging: read the manifest, hash the files each Task
names, and hand both to the pure core (`domain.manifest`, `domain.revision`),
which validates them and materializes the revision. A bad manifest or a missing
file raises `ManifestError` naming the file, the table and the key.

A manifest dict has no folder, so its Tasks give file digests instead of paths to
read (`files = {"fetch.py" = "sha256:<64 hex>"}`), or name no files at all; see
`domain.manifest`.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from domain.canonical import DIGEST_PREFIX
from domain.errors import QlflowError
from domain.manifest import (
    DICT_SOURCE,
    MANIFEST_FILE,
    Manifest,
    parse_manifest,
    revision_from_manifest,
    validate_manifest,
)
from domain.manifest_checks import manifest_error
from domain.revision import MaterializedRevision
from domain.transitions import Status
from qlflow.python.source import check_python_task

_CHUNK = 1 << 20
MAX_TASK_FILE_BYTES = 64 << 20  # a file a Task names is hashed at publish and before each run


@dataclass(frozen=True, slots=True)
class LoadedPackage:
    """A validated package ready to publish.

    `revision` is materialized at generation 1 as a draft: publishing assigns the
    real generation (the installation's head + 1) and re-materializes it there.
    `file_digests` maps every file a Task names to the SHA-256 of its bytes.
    """

    source: str
    folder: Path | None
    manifest: Manifest
    revision: MaterializedRevision
    publisher: str
    file_digests: Mapping[str, str]


def load(path_or_manifest: str | os.PathLike[str] | Mapping[str, Any]) -> LoadedPackage:
    """Load a package folder (or its `qlflow.toml` path), or a manifest dict."""
    if isinstance(path_or_manifest, Mapping):
        return package_from_manifest(path_or_manifest)
    if isinstance(path_or_manifest, (str, os.PathLike)):
        return load_package(path_or_manifest)
    raise manifest_error(
        DICT_SOURCE,
        None,
        None,
        "publish takes a package folder path or a manifest dict, "
        f"not {type(path_or_manifest).__name__}",
    )


def load_package(path: str | os.PathLike[str]) -> LoadedPackage:
    """Read a package folder (or the path of its `qlflow.toml`) and hash its files."""
    given = Path(path)
    manifest_path = (
        given if given.name == MANIFEST_FILE and given.is_file() else given / MANIFEST_FILE
    )
    source = str(manifest_path)
    if not manifest_path.is_file():
        raise manifest_error(
            source, None, None, f"no {MANIFEST_FILE} here; a package is a folder holding one"
        )
    folder = manifest_path.parent
    try:
        text = manifest_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise manifest_error(source, None, None, f"not UTF-8 text: {error}") from None
    manifest = parse_manifest(text, source, folder=True)
    digests: dict[str, str] = {}
    for task in manifest.tasks:
        for relative in task.files:
            if relative not in digests:
                digests[relative] = _file_digest(folder, relative, source, task.task_id)
        check_python_task(folder, task, source)
    revision = revision_from_manifest(manifest, digests)
    return LoadedPackage(
        source=source,
        folder=folder,
        manifest=manifest,
        revision=revision,
        publisher=manifest.package.publisher,
        file_digests=MappingProxyType(dict(sorted(digests.items()))),
    )


def package_from_manifest(manifest: Mapping[str, Any]) -> LoadedPackage:
    """Validate a manifest dict (the shape of a parsed `qlflow.toml`)."""
    validated = validate_manifest(manifest, DICT_SOURCE, folder=False)
    digests = {path: digest for task in validated.tasks for path, digest in task.file_digests}
    revision = revision_from_manifest(validated)
    return LoadedPackage(
        source=DICT_SOURCE,
        folder=None,
        manifest=validated,
        revision=revision,
        publisher=validated.package.publisher,
        file_digests=MappingProxyType(dict(sorted(digests.items()))),
    )


def file_digest(path: str | os.PathLike[str]) -> str:
    """ "sha256:" and the hex SHA-256 of a file's bytes."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    return DIGEST_PREFIX + hasher.hexdigest()


class TaskFileError(QlflowError):
    """A file a Task names cannot be used. `problem`: "missing", "outside" (the path
    or a symlink on it leads out of the package folder), "not_regular" (a folder, a
    device, a pipe), "too_large", "unreadable" or "cancelled"."""

    def __init__(self, relative: str, problem: str, message: str) -> None:
        self.relative = relative
        self.problem = problem
        super().__init__(message)


def task_file_digest(
    folder: str | os.PathLike[str],
    relative: str,
    *,
    cancelled: Callable[[], bool] | None = None,
    max_bytes: int = MAX_TASK_FILE_BYTES,
) -> str:
    """The digest of a file a Task names, after the checks publishing and every run
    make alike: it lies inside `folder` (no symlink leads out), it is a regular file,
    and it holds at most `max_bytes`. The read is bounded by that size and stops
    when `cancelled()` turns true. TaskFileError says what is wrong."""
    root = Path(folder).resolve()
    path = root / relative
    resolved = path.resolve()
    if resolved != root and root not in resolved.parents:
        raise TaskFileError(
            relative, "outside", f"{relative!r} leads outside the package folder (a symlink)"
        )
    if not path.exists():
        raise TaskFileError(relative, "missing", f"file {relative!r} does not exist")
    try:
        # not following a symlink swapped in since the check; not blocking on a pipe
        fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise TaskFileError(
            relative, "unreadable", f"cannot read {relative!r}: {error.strerror}"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise TaskFileError(relative, "not_regular", f"{relative!r} is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > max_bytes:
            raise _too_large(relative, max_bytes)
        hasher = hashlib.sha256()
        read = 0
        try:
            while chunk := handle.read(min(_CHUNK, max_bytes + 1 - read)):
                read += len(chunk)
                if read > max_bytes:  # it grew while being read
                    raise _too_large(relative, max_bytes)
                if cancelled is not None and cancelled():
                    raise TaskFileError(relative, Status.CANCELLED, f"reading {relative!r} stopped")
                hasher.update(chunk)
        except OSError as error:
            raise TaskFileError(
                relative, "unreadable", f"cannot read {relative!r}: {error.strerror}"
            ) from None
    return DIGEST_PREFIX + hasher.hexdigest()


def _too_large(relative: str, max_bytes: int) -> TaskFileError:
    return TaskFileError(
        relative,
        "too_large",
        f"{relative!r} is larger than {max_bytes // (1 << 20)} MiB, the most a Task's file may be",
    )


def _file_digest(folder: Path, relative: str, source: str, task_id: str) -> str:
    try:
        return task_file_digest(folder, relative)
    except TaskFileError as error:
        raise manifest_error(source, f"tasks.{task_id}", "files", str(error)) from None
