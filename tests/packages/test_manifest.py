"""Manifest validation (SPEC §11): every refusal names the file, the table and the key."""

from __future__ import annotations

import itertools
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import ManifestError
from domain.manifest import (
    DEFAULT_PROJECT,
    DICT_SOURCE,
    parse_manifest,
    revision_from_manifest,
    validate_manifest,
)
from tests.hypothesis_budget import examples

GOOD = """
[package]
name = "backup"
publisher = "acme"
[tasks.fetch]
command = ["python3", "fetch.py"]
files = ["fetch.py"]
[tasks.archive]
command = ["sh", "-c", "tar czf out.tgz data"]
[workflows.nightly]
timeout_ms = 600000
steps = [{ key = "fetch", task = "fetch" },
         { key = "archive", task = "archive", needs = ["fetch"] }]
"""

HEADER = '[package]\nname = "backup"\npublisher = "acme"\n'
FETCH = '[tasks.fetch]\ncommand = ["python3", "fetch.py"]\n'
ARCHIVE = '[tasks.archive]\ncommand = ["sh", "-c", "tar czf out.tgz data"]\n'


def _flow(steps: str, extra: str = "") -> str:
    return f"[workflows.nightly]\nsteps = {steps}\n{extra}"


TWO_STEPS = (
    '[{key = "fetch", task = "fetch"}, {key = "archive", task = "archive", needs = ["fetch"]}]'
)

# (manifest text, the exact message the refusal must carry)
ERRORS = [
    (
        HEADER + FETCH + ARCHIVE + _flow(TWO_STEPS.replace('task = "archive"', 'task = "archiv"')),
        "qlflow.toml: [workflows.nightly] steps[1].task: unknown task 'archiv' "
        "(tasks: archive, fetch)",
    ),
    (
        HEADER
        + FETCH
        + _flow('[{key = "fetch", task = "fetch"}, {key = "fetch", task = "fetch"}]'),
        "qlflow.toml: [workflows.nightly] steps[1].key: duplicate step key 'fetch' "
        "(first at steps[0])",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fetch", task = "fetch", needs = ["feth"]}]'),
        "qlflow.toml: [workflows.nightly] steps[0].needs: unknown step 'feth' (steps: fetch)",
    ),
    (
        HEADER
        + FETCH
        + _flow(
            '[{key = "a", task = "fetch", needs = ["c"]}, {key = "b", task = "fetch", '
            'needs = ["a"]}, {key = "c", task = "fetch", needs = ["b"]}]'
        ),
        "qlflow.toml: [workflows.nightly] steps: cycle: a -> c -> b -> a",
    ),
    (
        HEADER + FETCH + _flow('[{key = "a", task = "fetch", needs = ["a"]}]'),
        "qlflow.toml: [workflows.nightly] steps[0].needs: step 'a' needs itself",
    ),
    (
        HEADER + '[tasks.fetch]\nenv = { A = "1" }\n',
        "qlflow.toml: [tasks.fetch] command: missing: a Task needs a command, "
        'e.g. ["python3", "x.py"], or python = "module:function"',
    ),
    (
        HEADER + "[tasks.fetch]\ncommand = []\n",
        "qlflow.toml: [tasks.fetch] command: must be a non-empty list of strings, not a list []",
    ),
    (
        HEADER + '[tasks.fetch]\ncommand = "python3 fetch.py"\n',
        "qlflow.toml: [tasks.fetch] command: must be a non-empty list of strings, "
        "not a string 'python3 fetch.py'",
    ),
    (
        HEADER + '[tasks.fetch]\ncommand = ["python3", 3]\n',
        "qlflow.toml: [tasks.fetch] command[1]: must be a string, not an integer 3",
    ),
    (
        HEADER + '[tasks.fetch]\ncommand = ["", "x"]\n',
        "qlflow.toml: [tasks.fetch] command[0]: the program must not be empty",
    ),
    (
        HEADER + '[tasks.fetch]\ncmd = ["true"]\ncommand = ["true"]\n',
        "qlflow.toml: [tasks.fetch] cmd: unknown key "
        "(allowed: command, python, isolation, env, files, enabled, on_interrupt, concurrency,"
        " timeout_ms)",
    ),
    (
        HEADER + FETCH + 'env = ["A=1"]\n',
        "qlflow.toml: [tasks.fetch] env: must be a table of strings, not a list",
    ),
    (
        HEADER + FETCH + "env = { A = 1 }\n",
        "qlflow.toml: [tasks.fetch] env.A: must be a string, not an integer 1",
    ),
    (
        HEADER + FETCH + 'env = { "1A" = "x" }\n',
        "qlflow.toml: [tasks.fetch] env.1A: not a valid environment variable name",
    ),
    (
        HEADER + FETCH + 'files = ["/etc/passwd"]\n',
        "qlflow.toml: [tasks.fetch] files[0]: '/etc/passwd' is an absolute path; "
        "name files relative to the package folder",
    ),
    (
        HEADER + FETCH + 'files = ["lib/../../x.py"]\n',
        "qlflow.toml: [tasks.fetch] files[0]: 'lib/../../x.py' is not a plain relative path "
        "inside the package (no '..', '.' or empty parts)",
    ),
    (
        HEADER + FETCH + 'files = ["a.py", "a.py"]\n',
        "qlflow.toml: [tasks.fetch] files: names 'a.py' twice",
    ),
    (
        HEADER + FETCH + 'files = { "a.py" = "sha256:00" }\n',
        "qlflow.toml: [tasks.fetch] files: must be a list of relative paths, not a table "
        "(qlflow reads and hashes the files itself)",
    ),
    (
        HEADER + FETCH + 'enabled = "yes"\n',
        "qlflow.toml: [tasks.fetch] enabled: must be true or false, not a string 'yes'",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fetch", task = "fetch"}]', "timeout_ms = -5\n"),
        "qlflow.toml: [workflows.nightly] timeout_ms: must be a positive integer, "
        "not an integer -5",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fetch", task = "fetch"}]', "timeout_ms = 1.5\n"),
        "qlflow.toml: [workflows.nightly] timeout_ms: must be a positive integer, not a float 1.5",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fetch", task = "fetch"}]', "timeout_ms = true\n"),
        "qlflow.toml: [workflows.nightly] timeout_ms: must be a positive integer, "
        "not a boolean True",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fetch", task = "fetch"}]', 'schedule = "daily"\n'),
        "qlflow.toml: [workflows.nightly] schedule: unknown key (allowed: steps, timeout_ms, "
        "enabled, schedules, params, notify, max_running, concurrency, priority)",
    ),
    (
        HEADER + FETCH + "[workflows.nightly]\ntimeout_ms = 5\n",
        "qlflow.toml: [workflows.nightly] steps: missing: a Workflow needs at least one step",
    ),
    (
        HEADER + FETCH + _flow("[]"),
        "qlflow.toml: [workflows.nightly] steps: must be a non-empty list of tables, not a list []",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fetch", task = "fetch", after = ["x"]}]'),
        "qlflow.toml: [workflows.nightly] steps[0].after: unknown key "
        "(allowed: key, task, needs, retry, timeout_ms)",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fetch"}]'),
        "qlflow.toml: [workflows.nightly] steps[0].task: missing",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fetch", task = "fetch", needs = "x"}]'),
        "qlflow.toml: [workflows.nightly] steps[0].needs: must be a list of step keys, "
        "not a string 'x'",
    ),
    (
        HEADER + FETCH + _flow('[{key = "fe tch", task = "fetch"}]'),
        "qlflow.toml: [workflows.nightly] steps[0].key: step key 'fe tch' must be 1-64 "
        "characters of A-Z a-z 0-9 _ -, starting with a letter or digit",
    ),
    (
        FETCH,
        "qlflow.toml: [package]: missing (it needs name and publisher)",
    ),
    (
        '[package]\nname = "backup"\n',
        "qlflow.toml: [package] publisher: missing (1-36 characters of A-Z a-z 0-9 . _ -, "
        "starting with a letter or digit)",
    ),
    (
        '[package]\nname = "backup"\npublisher = "ac me"\n',
        "qlflow.toml: [package] publisher: publisher 'ac me' must be 1-36 characters of "
        "A-Z a-z 0-9 . _ -, starting with a letter or digit",
    ),
    (
        '[package]\nname = 7\npublisher = "acme"\n',
        "qlflow.toml: [package] name: name must be a string, not an integer 7",
    ),
    (
        HEADER + 'version = "1"\n',
        "qlflow.toml: [package] version: unknown key (allowed: name, publisher, project, "
        "installation)",
    ),
    (
        HEADER + '[triggers.cron]\nat = "3am"\n',
        "qlflow.toml: unknown table [triggers] (allowed: package, tasks, workflows)",
    ),
    (
        HEADER + "tasks = 3\n",
        "qlflow.toml: [package] tasks: unknown key (allowed: name, publisher, project, "
        "installation)",
    ),
    (
        "tasks = 3\n" + HEADER,
        "qlflow.toml: tasks: must be a table, not an integer",
    ),
    (
        HEADER + '[tasks."bad#id"]\ncommand = ["true"]\n',
        "qlflow.toml: [tasks] bad#id: task id 'bad#id' must be 1-64 characters of "
        "A-Z a-z 0-9 _ -, starting with a letter or digit",
    ),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[m[13:60] for _, m in ERRORS])
def test_each_refusal_names_file_table_and_key(text: str, message: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)
    assert str(caught.value) == message


def test_refusal_carries_table_and_key_as_attributes() -> None:
    bad = HEADER + FETCH + ARCHIVE + _flow(TWO_STEPS.replace('"archive", needs', '"archiv", needs'))
    with pytest.raises(ManifestError) as caught:
        parse_manifest(bad, "pkg/qlflow.toml")
    assert (caught.value.source, caught.value.table, caught.value.key) == (
        "pkg/qlflow.toml",
        "workflows.nightly",
        "steps[1].task",
    )


def test_toml_syntax_error_names_the_line() -> None:
    text = HEADER + '[tasks.fetch]\ncommand = ["python3" "fetch.py"]\n'
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)
    message = str(caught.value)
    assert message.startswith("qlflow.toml: TOML syntax error: ")
    assert "line 5" in message


def test_too_many_steps_refused() -> None:
    steps = ", ".join(f'{{key = "s{i}", task = "fetch"}}' for i in range(129))
    with pytest.raises(ManifestError, match=r"\[workflows.nightly\] steps: has 129 steps; at most"):
        parse_manifest(HEADER + FETCH + _flow(f"[{steps}]"))


def test_good_manifest_applies_defaults_and_sorts() -> None:
    manifest = parse_manifest(GOOD)
    assert manifest.package.project == DEFAULT_PROJECT
    assert manifest.package.installation == "backup"
    assert [task.task_id for task in manifest.tasks] == ["archive", "fetch"]
    workflow = manifest.workflow("nightly")
    assert workflow.timeout_ms == 600000 and workflow.enabled
    assert [(s.key, s.task, s.needs) for s in workflow.steps] == [
        ("fetch", "fetch", ()),
        ("archive", "archive", ("fetch",)),
    ]
    assert manifest.task("fetch").files == ("fetch.py",)


def test_dict_manifest_refuses_file_paths_without_digests() -> None:
    raw = {
        "package": {"name": "backup", "publisher": "acme"},
        "tasks": {"fetch": {"command": ["python3", "fetch.py"], "files": ["fetch.py"]}},
    }
    with pytest.raises(ManifestError) as caught:
        validate_manifest(raw)
    message = str(caught.value)
    assert message.startswith(f"{DICT_SOURCE}: [tasks.fetch] files: must be a table")
    assert "a manifest dict has no folder to read files from" in message


def test_dict_manifest_refuses_a_malformed_file_digest() -> None:
    raw = {
        "package": {"name": "backup", "publisher": "acme"},
        "tasks": {"fetch": {"command": ["true"], "files": {"fetch.py": "md5:abc"}}},
    }
    with pytest.raises(ManifestError) as caught:
        validate_manifest(raw)
    assert str(caught.value) == (
        f"{DICT_SOURCE}: [tasks.fetch] files.'fetch.py': must be \"sha256:<64 hex>\", "
        "not a string 'md5:abc'"
    )


def test_dict_manifest_file_digests_enter_the_source_digest() -> None:
    def revision(digest: str):
        raw = {
            "package": {"name": "backup", "publisher": "acme"},
            "tasks": {
                "fetch": {"command": ["python3", "fetch.py"], "files": {"fetch.py": digest}},
                "other": {"command": ["true"]},
            },
        }
        return revision_from_manifest(validate_manifest(raw))

    one, two = revision("sha256:" + "1" * 64), revision("sha256:" + "2" * 64)
    assert one.tasks["fetch"].source_digest != two.tasks["fetch"].source_digest
    assert one.tasks["other"].source_digest == two.tasks["other"].source_digest
    assert one.lock_digest != two.lock_digest


def test_folder_manifest_needs_every_file_digest() -> None:
    manifest = parse_manifest(GOOD)
    with pytest.raises(ManifestError) as caught:
        revision_from_manifest(manifest, {})
    assert str(caught.value) == "qlflow.toml: [tasks.fetch] files: no digest for file 'fetch.py'"


# --- properties ---------------------------------------------------------------------------

keys = st.lists(
    st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=12, unique=True
)


@st.composite
def dags(draw):
    """A random acyclic step list: each step needs only earlier steps."""
    names = draw(keys)
    steps = []
    for index, name in enumerate(names):
        needs = draw(st.lists(st.sampled_from(names[:index]), unique=True)) if index else []
        steps.append({"key": name, "task": "t", "needs": needs})
    return steps


def _raw(steps, tasks=None) -> dict:
    return {
        "package": {"name": "pkg", "publisher": "acme"},
        "tasks": tasks or {"t": {"command": ["true"]}},
        "workflows": {"flow": {"steps": steps}},
    }


@settings(max_examples=examples(100), deadline=None)
@given(dags())
def test_every_dag_is_accepted_with_sorted_needs(steps) -> None:
    manifest = validate_manifest(_raw(steps))
    workflow = manifest.workflow("flow")
    assert [step.key for step in workflow.steps] == [step["key"] for step in steps]
    for step, raw in zip(workflow.steps, steps, strict=True):
        assert step.needs == tuple(sorted(raw["needs"]))
    revision_from_manifest(manifest)


@settings(max_examples=examples(100), deadline=None)
@given(dags(), st.data())
def test_a_back_edge_is_reported_as_a_cycle(steps, data) -> None:
    if len(steps) < 2:
        return
    late = data.draw(st.integers(1, len(steps) - 1))
    early = data.draw(st.integers(0, late - 1))
    # make an earlier step need a later one that (transitively) needs it
    steps[late]["needs"] = sorted({*steps[late]["needs"], steps[early]["key"]})
    steps[early]["needs"] = sorted({*steps[early]["needs"], steps[late]["key"]})
    with pytest.raises(ManifestError) as caught:
        validate_manifest(_raw(steps))
    message = str(caught.value)
    assert message.startswith(f"{DICT_SOURCE}: [workflows.flow] steps: cycle: ")
    path = message.rsplit("cycle: ", 1)[1].split(" -> ")
    assert path[0] == path[-1] and len(path) >= 3
    needs = {step["key"]: step["needs"] for step in steps}
    for current, following in itertools.pairwise(path):
        assert following in needs[current]


@settings(max_examples=examples(60), deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"x[a-z]{0,4}", fullmatch=True),
        st.lists(st.text(min_size=1, max_size=5).filter(lambda s: "\x00" not in s), min_size=1),
        min_size=1,
        max_size=5,
    ),
    st.randoms(use_true_random=False),
)
def test_table_order_does_not_change_the_revision(tasks, rng) -> None:
    table = {name: {"command": command} for name, command in tasks.items()}
    shuffled_names = list(table)
    rng.shuffle(shuffled_names)
    shuffled = {name: table[name] for name in shuffled_names}
    first = revision_from_manifest(
        validate_manifest(_raw([{"key": "s", "task": "t"}], {**table, "t": {"command": ["true"]}}))
    )
    second = revision_from_manifest(
        validate_manifest(
            _raw([{"key": "s", "task": "t"}], {"t": {"command": ["true"]}, **shuffled})
        )
    )
    assert first.revision_digest == second.revision_digest
    assert first.lock_digest == second.lock_digest


def test_manifest_text_round_trip_matches_dict_form() -> None:
    from_text = parse_manifest(textwrap.dedent(GOOD).replace('files = ["fetch.py"]\n', ""))
    from_dict = validate_manifest(
        {
            "package": {"name": "backup", "publisher": "acme"},
            "tasks": {
                "fetch": {"command": ["python3", "fetch.py"]},
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
    assert revision_from_manifest(from_text) == revision_from_manifest(from_dict)
