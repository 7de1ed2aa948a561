"""`qlflow rerun`, `runs --rerun-of` and `show` tell a Run's lineage: which Run it
reruns, which of its steps were reused from where, and which Runs rerun it."""

from __future__ import annotations

import qlflow
from tests.cli.helpers import qlflow as run_cli
from tests.cli.helpers import qlflow_json
from tests.rerun.support import failed_run


def test_lineage_from_the_command_line(store_url, tmp_path):
    with qlflow.open(store_url) as rt:
        source = failed_run(rt)

    done = qlflow_json("rerun", source[:12], db=store_url, cwd=tmp_path)
    rerun_id = done["receipt"]["run_id"]
    assert done["rerun_of"] == source
    assert done["reused"] == ["fetch", "left"]

    listed = qlflow_json("runs", "--rerun-of", source[:12], db=store_url, cwd=tmp_path)
    assert [r["run_id"] for r in listed] == [rerun_id]
    assert [r["run_id"] for r in qlflow_json("runs", "--rerun-of", rerun_id, db=store_url,
                                             cwd=tmp_path)] == []  # fmt: skip

    shown = qlflow_json("show", source, db=store_url, cwd=tmp_path)
    assert shown["rerun_as"] == [rerun_id]
    text = run_cli("show", rerun_id, db=store_url, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert f"rerun of {source}" in text.stdout
    assert f"fetch: reused from run {source}" in text.stdout
    assert "right: reused" not in text.stdout
    text = run_cli("show", source, db=store_url, cwd=tmp_path)
    assert f"rerun as {rerun_id}" in text.stdout

    why = run_cli("why", rerun_id, db=store_url, cwd=tmp_path)
    assert f"a rerun of run {source}; reused from run {source}: fetch, left" in why.stdout
    assert "a rerun of" not in run_cli("why", source, db=store_url, cwd=tmp_path).stdout
    report = qlflow_json("why", rerun_id, db=store_url, cwd=tmp_path)
    assert report["rerun_of"] == source
    assert report["reused"] == [["fetch", source], ["left", source]]


def test_rerun_of_an_unknown_run_is_refused(store_url, tmp_path):
    with qlflow.open(store_url) as rt:
        failed_run(rt)
    done = run_cli("runs", "--rerun-of", "ffffffffffff", db=store_url, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert "ffffffffffff" in done.stderr
