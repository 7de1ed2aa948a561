"""Finding what to run for a leased Attempt: its Task's command in the Run's
published revision, and the package folder on this host that holds its files."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from domain.errors import NotFound, QlflowError
from domain.plan import task_ref
from domain.revision import MaterializedRevision, revision_from_json
from domain.tasks import ON_INTERRUPT_DEFAULT, TaskDefinition, task_source_digest
from domain.transitions import Status
from projections.published_revisions import published_revisions
from qlflow.packages import TaskFileError, load_package, task_file_digest
from qlflow.runtime import Lease, Runtime

TASK_FILE_REFUSED = "task_file_refused"  # a file the Task names fails the package checks
SOURCE_CHANGED = "source_changed"  # the files no longer give the published source digest


class TaskUnavailable(QlflowError):
    """The local executor cannot run an Attempt's Task here (no package folder known
    for it, or the folder no longer holds the published files). `result_code` is
    what the Attempt fails with (None: the executor's `start_failed`); `cancelled`
    means the host stopped the check and nothing should be recorded."""

    def __init__(
        self, message: str, result_code: str | None = None, cancelled: bool = False
    ) -> None:
        self.result_code = result_code
        self.cancelled = cancelled
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class TaskCommand:
    """What to run for an Attempt: argv, the Task's own env, and the package folder;
    for a python Task, `python` ("module:function"), its `isolation` and the
    source digest the folder's files were checked against (argv is empty)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    python: str | None = None
    isolation: str | None = None
    source_digest: str | None = None
    on_interrupt: str = ON_INTERRUPT_DEFAULT  # the Task's declaration: requeue | fail


class PublishedTasks:
    """Resolves a lease to the command of its Task, from the Run's publication.

    The publication holds the revision (commands, env, file lists and source
    digests) but not where the package lives on this host, so the folder comes from
    `folders` (package name -> folder, as given to `run PATH`, `worker
    --package-dir` or `serve --package-dir`), or from a `source_path` the
    publication may record. Before a Task runs, the files it names are hashed again
    and must give its published source digest: a folder that changed since
    publication never runs under the old generation's name.
    """

    def __init__(
        self, rt: Runtime, folders: Mapping[str, str | os.PathLike[str]] | None = None
    ) -> None:
        self._rt = rt
        self._folders: dict[str, Path] = {}
        self._revisions: dict[str, tuple[MaterializedRevision, Path | None]] = {}
        # (folder, source digest) -> the files' stat signature when they last hashed
        # to that digest: an unchanged signature needs no second read and hash
        self._verified: dict[tuple[Path, str], tuple[tuple[int, ...], ...]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        for package, folder in (folders or {}).items():
            self.add_folder(folder, package)

    def add_folder(self, folder: str | os.PathLike[str], package: str | None = None) -> str:
        """Serve Tasks of the package in `folder` (its name read from its qlflow.toml
        unless given). Returns the package name."""
        path = Path(folder).resolve()
        if package is None:
            package = load_package(path).manifest.package.name
        with self._lock:
            self._folders[package] = path
        return package

    def stop_reads(self) -> None:
        """Stop every check of a Task's files now in progress, and refuse new ones (the
        host is shutting down: an Attempt not yet started is left to its lease)."""
        self._stopped.set()

    @property
    def packages(self) -> list[str]:
        """The packages this worker has a folder for."""
        with self._lock:
            return sorted(self._folders)

    def task_refs(self) -> frozenset[str]:
        """The task refs of every published generation of the packages this worker has
        a folder for: lease only these, never a Task it could not start."""
        refs: set[str] = set()
        for package in self.packages:
            for publication_id, data in published_revisions(self._rt.store, package=package):
                revision, _ = self._remember(publication_id, data)
                refs.update(task_ref(package, revision.generation, t) for t in revision.tasks)
        return frozenset(refs)

    def runs_python(self, lease: Lease) -> bool:
        """Whether `lease`'s Task is a python function (its files are not checked here:
        `resolve` does that)."""
        return self._task(lease)[0].runs_python

    def resolve(self, lease: Lease) -> TaskCommand:
        """The command for `lease`'s Task; TaskUnavailable if it cannot run here."""
        task, revision, folder = self._task(lease)
        if folder is None:
            raise TaskUnavailable(
                f"no package folder known for package {revision.package!r} on this worker; "
                "give it with --package-dir"
            )
        self._check_files_once(task, folder, revision)
        if task.runs_python:
            return TaskCommand(
                argv=(),
                env=dict(task.env),
                cwd=folder,
                python=task.python,
                isolation=task.isolation_mode,
                source_digest=task.source_digest,
                on_interrupt=task.on_interrupt,
            )
        return TaskCommand(
            argv=tuple(task.command), env=dict(task.env), cwd=folder, on_interrupt=task.on_interrupt
        )

    def _check_files_once(
        self, task: TaskDefinition, folder: Path, revision: MaterializedRevision
    ) -> None:
        """`_check_files`, skipped while none of the files changed since they last
        passed it: the same device, inode, size, mtime and ctime of every file (a
        write, a rename over it, a chmod or a symlink retargeted all change one)."""
        key = (folder, task.source_digest)
        signature = _stat_signature(folder, task.files)
        with self._lock:
            if signature is not None and self._verified.get(key) == signature:
                return
        _check_files(task, folder, revision, self._stopped.is_set)
        if signature is not None:
            with self._lock:
                self._verified[key] = signature

    def _task(self, lease: Lease) -> tuple[TaskDefinition, MaterializedRevision, Path | None]:
        """The lease's Task, its revision, and the package folder known for it."""
        publication_id = self._publication_of(lease.run_id)
        revision, recorded_folder = self._revision(publication_id)
        task = next(
            (
                task
                for task_id, task in revision.tasks.items()
                if task_ref(revision.package, revision.generation, task_id) == lease.task_ref
            ),
            None,
        )
        if task is None:
            raise TaskUnavailable(
                f"publication {publication_id} has no Task for task ref {lease.task_ref}"
            )
        with self._lock:
            folder = self._folders.get(revision.package, recorded_folder)
        return task, revision, folder

    def _publication_of(self, run_id: str) -> str:
        # not remembered here: one entry per Run would grow for as long as the host runs
        return self._rt._publication_of(run_id)

    def _revision(self, publication_id: str) -> tuple[MaterializedRevision, Path | None]:
        with self._lock:
            cached = self._revisions.get(publication_id)
        if cached is not None:
            return cached
        # through a definer function where the runtime role may not read publications
        found = published_revisions(self._rt.store, publication_id=publication_id)
        if not found:
            raise NotFound(f"publication {publication_id!r} has no published revision")
        return self._remember(publication_id, found[0][1])

    def _remember(
        self, publication_id: str, data: Mapping[str, object]
    ) -> tuple[MaterializedRevision, Path | None]:
        with self._lock:
            cached = self._revisions.get(publication_id)
        if cached is not None:
            return cached
        revision = revision_from_json(data["revision"])
        source = data.get("source_path")
        entry = (revision, Path(source) if isinstance(source, str) and source else None)
        with self._lock:
            self._revisions[publication_id] = entry
        return entry


def _stat_signature(folder: Path, files: Iterable[str]) -> tuple[tuple[int, ...], ...] | None:
    """What identifies the folder's and the files' current versions without reading
    them; None when one cannot be seen (the full check then says why)."""
    signature = []
    try:
        for path in (folder, *(folder / relative for relative in files)):
            info = os.stat(path)
            signature.append(
                (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
            )
    except OSError:
        return None
    return tuple(signature)


def _check_files(
    task: TaskDefinition,
    folder: Path,
    revision: MaterializedRevision,
    cancelled: Callable[[], bool],
) -> None:
    """The files the Task names pass the checks publishing made (inside the folder,
    regular, bounded in size) and, hashed again, give its published source digest."""
    if not folder.is_dir():
        raise TaskUnavailable(f"package folder {str(folder)!r} does not exist")
    digests = {}
    for relative in task.files:
        try:
            digests[relative] = task_file_digest(folder, relative, cancelled=cancelled)
        except TaskFileError as error:
            refused = error.problem in ("outside", "not_regular", "too_large")
            raise TaskUnavailable(
                f"Task {task.task_id!r} in {str(folder)!r}: {error}",
                result_code=TASK_FILE_REFUSED if refused else None,
                cancelled=error.problem == Status.CANCELLED,
            ) from None
    if task_source_digest(task.definition(), digests) != task.source_digest:
        raise TaskUnavailable(
            f"Task {task.task_id!r}: the files in {str(folder)!r} changed since "
            f"{revision.package} generation {revision.generation} was published; "
            "publish again and start a new Run",
            result_code=SOURCE_CHANGED,
        )
