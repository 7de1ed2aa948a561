"""`qlflow limits`, `qlflow limits set` and `qlflow start -P` as a person uses them
(docs/DESIGN.md "Flow control"): the listing, a change recorded with who made it,
and bad input as one line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import qlflow, qlflow_json

MANIFEST = """
[package]
name = "etl"
publisher = "acme"

[tasks.fetch]
command = ["true"]
concurrency = { limit = 1, key = "{params.region}" }

[workflows.nightly]
max_running = 1
priority = 3
steps = [{ key = "fetch", task = "fetch" }]

[workflows.nightly.params.region]
type = "string"
default = "eu"
"""


def test_limits_are_listed_set_and_refused_as_a_person_reads_them(tmp_path: Path):
    db = f"sqlite:///{tmp_path / 'q.db'}"
    package = tmp_path / "etl"
    package.mkdir()
    (package / "qlflow.toml").write_text(MANIFEST)
    assert qlflow("publish", str(package), db=db, cwd=tmp_path).returncode == 0
    first = qlflow_json("start", "etl", "nightly", "-P", "9", db=db, cwd=tmp_path)
    qlflow_json("start", "etl", "nightly", "-p", "region=us", db=db, cwd=tmp_path)

    listed = {view["target"]: view for view in qlflow_json("limits", db=db, cwd=tmp_path)}
    nightly = listed["workflow:etl/nightly"]
    assert (nightly["limit"], nightly["in_use"], nightly["waiting"]) == (1, 1, 1)
    assert [h["run_id"] for h in nightly["holders"]] == [first["run_id"]]
    assert listed["task:etl/fetch"]["key"] == "{params.region}"
    assert listed["task:etl/fetch[eu]"]["waiting"] == 1
    table = qlflow("limits", db=db, cwd=tmp_path)
    assert table.returncode == 0 and "workflow:etl/nightly" in table.stdout
    assert "1 (declared)" in table.stdout

    change = qlflow_json(
        "limits", "set", "workflow:etl/nightly", "2", "--by", "ops", db=db, cwd=tmp_path
    )
    assert (change["old"], change["new"], change["changed"], change["set_by"]) == (
        1,
        2,
        True,
        "ops",
    )
    said = qlflow("limits", "set", "task:etl/fetch[us]", "3", db=db, cwd=tmp_path)
    assert said.returncode == 0 and "task:etl/fetch[us]: 1 -> 3" in said.stdout

    events = len(qlflow_json("events", db=db, cwd=tmp_path))
    for args, words in (
        (("limits", "set", "workflow:etl/nightly", "0"), "limit must be from 1 to 10000"),
        (("limits", "set", "task:etl/other", "2"), "declares no limit"),
        (("limits", "set", "nightly", "2"), "is no limit"),
        (("start", "etl", "nightly", "-P", "1001"), "priority must be from -1000 to 1000"),
    ):
        refused = qlflow(*args, db=db, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert words in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert len(qlflow_json("events", db=db, cwd=tmp_path)) == events
