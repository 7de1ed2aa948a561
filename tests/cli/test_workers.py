"""`qlflow workers` through the real entry point on both stores: the host that ran a
Workflow is listed with its worker id, host, slots and last renewal; `--json` for
scripts."""

from __future__ import annotations

import socket

import orjson

from tests.cli.helpers import qlflow, write_package

TOML = """
[package]
name = "fleet"
publisher = "tests"

[tasks.nap]
command = ["python3", "-c", "import time; time.sleep(1.5)"]

[workflows.flow]
steps = [{ key = "a", task = "nap" }, { key = "b", task = "nap", needs = ["a"] }]
"""


def test_the_host_that_ran_a_workflow_is_listed(store_url, tmp_path):
    package = write_package(tmp_path / "fleet", TOML)
    published = qlflow("publish", str(package), db=store_url, cwd=tmp_path)
    assert published.returncode == 0, published.stderr
    empty = qlflow("workers", db=store_url, cwd=tmp_path)
    assert empty.returncode == 0, empty.stderr
    assert "no workers seen lately" in empty.stdout
    ran = qlflow(
        "run", str(package), "flow", "--workers", "3", "--ttl-ms", "5000", "--json",
        db=store_url, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    listed = qlflow("workers", "--json", db=store_url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (worker,) = orjson.loads(listed.stdout)
    assert worker["host"] == socket.gethostname() and worker["slots"] == 3
    assert worker["running"] == 0 and worker["holding"] is False
    assert worker["ended"] == 2 and worker["last_ended_ms"] is not None
    assert worker["last_renewal_ms"] is None  # it holds no lease any more
    table = qlflow("workers", db=store_url, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert worker["worker_id"] in table.stdout and "0/3" in table.stdout
    since = qlflow("workers", "--since", "not-a-time", db=store_url, cwd=tmp_path)
    assert since.returncode == 2 and "--since" in since.stderr
