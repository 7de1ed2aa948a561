"""The README's least-privilege deployment, run as written: its shell block in
bash, with `qlflow` this checkout's command line and a schema and role prefix of
the test's own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from actors import roles as pg_roles
from tests.cli.helpers import EXAMPLES, REPO, cli_env

pytestmark = pytest.mark.pg

SECTION = "## PostgreSQL: the least-privilege deployment"


def readme_steps() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return block


def test_the_readme_steps_deploy_and_run_a_workflow(pg_server_url: str, tmp_path: Path):
    steps = readme_steps()
    assert "--schema qlflow --prefix qlflow" in steps
    suffix = uuid.uuid4().hex[:10]
    schema, prefix = f"readme_{suffix}", f"qreadme{suffix}"
    steps = steps.replace("--schema qlflow --prefix qlflow", f"--schema {schema} --prefix {prefix}")
    before, after = steps.split("# 4.", 1)
    assert before.rstrip().endswith("&"), "step 3 starts serve in the background"
    script = "\n".join(
        [
            "set -euo pipefail",
            before,
            "SERVE=$!",
            "trap 'kill $SERVE 2>/dev/null || true' EXIT",
            # the only addition: wait (with a deadline) for the Run to end
            "for _ in $(seq 300); do",
            '  if qlflow --db "$RUNTIME_URL" runs --status succeeded --json \\',
            "     | grep run_id >/dev/null; then break; fi; sleep 0.2",
            "done",
            "# 4." + after,
            "kill $SERVE; wait $SERVE || true",
        ]
    )
    shutil.copytree(EXAMPLES / "nightly", tmp_path / "examples" / "nightly")
    # `qlflow` is this checkout's command line (a program, so `qlflow ... &` gives its pid)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "qlflow").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m qlflow.cli "$@"\n')
    (bin_dir / "qlflow").chmod(0o755)
    env = cli_env({"ADMIN_URL": pg_server_url})
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    out, err = tmp_path / "steps.out", tmp_path / "steps.err"
    try:
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                ["bash", "-c", script], cwd=tmp_path, env=env, stdout=stdout, stderr=stderr
            )
            try:
                returncode = process.wait(timeout=180)
            finally:
                if process.poll() is None:
                    process.kill()
        done = subprocess.CompletedProcess(
            process.args, returncode, out.read_text("utf-8"), err.read_text("utf-8")
        )
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        pg_roles.drop_roles(pg_server_url, prefix)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded" in done.stdout  # step 4's runs --status succeeded
    assert "publication.published" in done.stdout  # the audit role reads the log
    assert "the log is sound" in done.stdout  # the owner's verify
    assert "error" not in done.stderr, done.stderr
