"""The README's embedding example is one a host can copy: run as it is written, it
drives the example package's Run to success and exits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import qlflow

REPO = Path(__file__).resolve().parents[2]


def embedding_example() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Embedding", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_embedding_example_runs_as_written(tmp_path: Path):
    shutil.copytree(REPO / "examples" / "nightly", tmp_path / "examples" / "nightly")
    (tmp_path / "example.py").write_text(embedding_example(), encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'example.db'}"
    done = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO), QLFLOW_DB=db),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with qlflow.open(db, read_only=True) as rt:
        [run] = rt.runs()
        view = rt.get_run(run.run_id)
    assert view.status == "succeeded"
    assert {key: step.status for key, step in view.steps.items()} == {
        "fetch": "succeeded",
        "archive": "succeeded",
    }
