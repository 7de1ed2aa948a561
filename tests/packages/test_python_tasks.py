"""Python Tasks in a manifest: `python = "module:function"`, checked at publish
without importing anything; the digests of command Tasks do not move."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from domain.errors import ManifestError, PlanError
from domain.manifest import parse_manifest
from domain.revision import revision_from_json, revision_to_json
from domain.tasks import define_task
from qlflow.packages import load_package

HEADER = '[package]\nname = "etl"\npublisher = "acme"\n'
FLOW = '[workflows.daily]\nsteps = [{key = "a", task = "fetch"}]\n'


def _task(body: str) -> str:
    return HEADER + "[tasks.fetch]\n" + textwrap.dedent(body) + FLOW


REFUSED = [
    (
        'python = "etl.fetch:run"\ncommand = ["true"]\nfiles = ["etl/fetch.py"]\n',
        "[tasks.fetch] python: a Task has a command or python, not both",
    ),
    ('python = "../x:y"\n', "python: '../x:y': module '../x' must be a dotted path inside"),
    ('python = "../x.y:run"\n', "[tasks.fetch] python: '../x.y:run': module '../x.y' must be"),
    ('python = "/abs/x:y"\n', "[tasks.fetch] python: '/abs/x:y' is an absolute path"),
    ('python = "etl.fetch"\n', "[tasks.fetch] python: 'etl.fetch' must be 'module.path:function'"),
    ('python = "etl.1x:run"\n', "module part '1x' is not a Python identifier"),
    ('python = "etl.class:run"\n', "module part 'class' is not a Python identifier"),
    ('python = "etl.fetch:run-it"\n', "function 'run-it' is not a Python identifier"),
    ("python = 3\n", "[tasks.fetch] python: must be a string 'module.path:function', not int"),
    (
        'python = "etl.fetch:run"\nfiles = ["etl/other.py"]\n',
        "[tasks.fetch] files: module 'etl.fetch' is not in files: name 'etl/fetch.py' "
        "(or 'etl/fetch/__init__.py')",
    ),
    (
        'python = "etl.fetch:run"\nfiles = ["etl/fetch.py"]\nisolation = "fiber"\n',
        "[tasks.fetch] isolation: must be one of process, thread, not 'fiber'",
    ),
    ('command = ["true"]\nisolation = "thread"\n', "[tasks.fetch] isolation: applies only"),
    (
        'python = "etl.fetch:run"\nfiles = ["etl/fetch.py"]\nenv = { A = "1" }\n',
        "[tasks.fetch] env: applies to a command Task",
    ),
]


@pytest.mark.parametrize(("body", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_bad_python_targets_are_refused_naming_the_field(body: str, message: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(_task(body))
    assert message in str(caught.value)
    assert caught.value.table == "tasks.fetch"


def test_a_python_task_parses_and_its_package_module_may_be_an_init() -> None:
    manifest = parse_manifest(
        _task('python = "etl.fetch:run"\nfiles = ["etl/fetch/__init__.py"]\nisolation = "thread"\n')
    )
    task = manifest.task("fetch")
    assert (task.python, task.isolation, task.command) == ("etl.fetch:run", "thread", ())


def test_python_enters_the_digest_only_where_declared() -> None:
    digests = {"etl/fetch.py": "0" * 64}
    command = define_task(
        "fetch", ["python3", "etl/fetch.py"], files=["etl/fetch.py"], file_digests=digests
    )
    assert "python" not in command.definition() and "isolation" not in command.definition()
    process = define_task(
        "fetch", [], python="etl.fetch:run", files=["etl/fetch.py"], file_digests=digests
    )
    thread = define_task(
        "fetch",
        [],
        python="etl.fetch:run",
        isolation="thread",
        files=["etl/fetch.py"],
        file_digests=digests,
    )
    other = define_task(
        "fetch", [], python="etl.fetch:main", files=["etl/fetch.py"], file_digests=digests
    )
    assert (
        len(
            {
                command.source_digest,
                process.source_digest,
                thread.source_digest,
                other.source_digest,
            }
        )
        == 4
    )
    with pytest.raises(PlanError, match="both a command and python"):
        define_task(
            "fetch", ["true"], python="etl.fetch:run", files=["etl/fetch.py"], file_digests=digests
        )


def _package(tmp_path: Path, module: str, body: str = 'python = "etl.fetch:run"\n') -> Path:
    folder = tmp_path / "etl"
    (folder / "etl").mkdir(parents=True)
    (folder / "etl" / "fetch.py").write_text(textwrap.dedent(module))
    (folder / "qlflow.toml").write_text(_task(body + 'files = ["etl/fetch.py"]\n'))
    return folder


def test_a_published_python_task_round_trips_through_the_revision_json(tmp_path: Path) -> None:
    loaded = load_package(_package(tmp_path, "def run(ctx):\n    return {}\n"))
    task = loaded.revision.task("fetch")
    assert task.python == "etl.fetch:run" and task.runs_python
    again = revision_from_json(revision_to_json(loaded.revision))
    assert again == loaded.revision and again.task("fetch").python == "etl.fetch:run"


def test_nothing_is_imported_at_publish(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    module = f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('boom')\n"
    loaded = load_package(_package(tmp_path, module + "def run(ctx):\n    return None\n"))
    assert loaded.revision.task("fetch").runs_python
    assert not marker.exists()


STATIC = [
    ("def main(ctx):\n    pass\n", "etl/fetch.py defines no function 'run' at its top level"),
    ("def run(ctx, other):\n    pass\n", "etl.fetch:run takes 2 arguments"),
    ("def run():\n    pass\n", "etl.fetch:run takes no argument"),
    ("def run(ctx, *, flag):\n    pass\n", "keyword-only arguments without defaults"),
    ("def run(ctx:\n", "etl/fetch.py does not parse"),
]


@pytest.mark.parametrize(("module", "message"), STATIC, ids=[m for _, m in STATIC])
def test_a_function_that_cannot_be_called_is_refused_at_publish(
    tmp_path: Path, module: str, message: str
) -> None:
    with pytest.raises(ManifestError) as caught:
        load_package(_package(tmp_path, module))
    assert message in str(caught.value)
    assert (caught.value.table, caught.value.key) == ("tasks.fetch", "python")


@pytest.mark.parametrize(
    "module",
    [
        "async def run(ctx, retries=3):\n    pass\n",
        "def run(*args):\n    pass\n",
        "from etl.impl import run\n",  # bound by an import: left to the run
        "def _run(ctx):\n    pass\nrun = _run\n",
    ],
)
def test_functions_that_may_be_called_are_accepted(tmp_path: Path, module: str) -> None:
    assert load_package(_package(tmp_path, module)).revision.task("fetch").runs_python


def test_a_missing_module_file_is_refused_naming_it(tmp_path: Path) -> None:
    folder = _package(tmp_path, "def run(ctx):\n    pass\n")
    (folder / "etl" / "fetch.py").unlink()
    with pytest.raises(ManifestError, match=r"file 'etl/fetch\.py' does not exist"):
        load_package(folder)
