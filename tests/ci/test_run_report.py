"""The run report CI checks: counted from a real pytest run of a small suite, and
.ci/check_report refuses a run where a PostgreSQL or HA test did not pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_report import REPORT_ENV, problems

REPO = Path(__file__).resolve().parents[2]
CONFTEST = "from tests.conftest import *  # noqa: F403  (the suite's hooks and fixtures)\n"
SUITE = """
import pytest

@pytest.fixture
def pg_server_url():
    return "postgresql://unused"  # the name is what marks the test

def test_plain():
    pass

@pytest.mark.pg
def test_marked_pg():
    pass

def test_asks_for_the_server(pg_server_url):
    pass

@pytest.mark.ha
def test_failover():
    {ha_body}
"""


def run_suite(
    tmp_path: Path, ha_body: str, *args: str, keep_conftest: bool = False
) -> tuple[int, dict]:
    if not keep_conftest:
        (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sample.py").write_text(SUITE.format(ha_body=ha_body))
    report = tmp_path / "report.json"
    env = {**os.environ, REPORT_ENV: str(report), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), "-c", os.devnull, str(tmp_path), *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.returncode, json.loads(report.read_text())


def test_under_xdist_the_controller_counts_the_same(tmp_path):
    """With pytest-xdist the controller collects nothing itself: the marks come with
    the workers' reports, and the workers write no report of their own."""
    status, summary = run_suite(tmp_path, "pass", "-n", "2")
    assert status == 0
    assert summary["marks"]["pg"]["collected"] == summary["marks"]["pg"]["passed"] == 2
    assert summary["marks"]["ha"]["passed"] == summary["marks"]["ha"]["collected"] == 1
    assert summary["all"]["collected"] == 4
    assert problems(summary) == []


def check(report: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / ".ci" / "check_report"), str(report)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_counts_come_from_the_run_and_the_server_fixture_marks_pg(tmp_path):
    status, summary = run_suite(tmp_path, "pass")
    assert status == 0
    assert summary["marks"]["pg"] == {
        "collected": 2, "passed": 2, "failed": 0, "skipped": 0, "not_run": 0, "skips": []
    }  # fmt: skip
    assert summary["marks"]["ha"]["passed"] == summary["marks"]["ha"]["collected"] == 1
    assert summary["all"]["collected"] == 4
    assert problems(summary) == []
    done = check(tmp_path / "report.json")
    assert done.returncode == 0, done.stderr
    assert "pg: 2 of 2 passed" in done.stdout


def test_a_skipped_ha_test_and_a_failed_teardown_fail_the_check(tmp_path):
    broken = (
        "import pytest\n\n"
        "@pytest.fixture(autouse=True)\n"
        "def broken(request):\n"
        "    yield\n"
        "    if request.node.name == 'test_marked_pg':\n"
        "        raise RuntimeError('x')\n"
    )
    (tmp_path / "conftest.py").write_text(CONFTEST + broken)
    status, summary = run_suite(tmp_path, 'pytest.skip("no initdb")', keep_conftest=True)
    assert status == 1  # the teardown error; the skip alone would leave pytest content
    assert summary["marks"]["ha"]["skipped"] == 1
    assert summary["marks"]["pg"]["failed"] == 1 and summary["marks"]["pg"]["passed"] == 1
    done = check(tmp_path / "report.json")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "'pg' tests: 1 of 2 passed (1 failed, 0 skipped, 0 never ran)",
        "'ha' tests: 0 of 1 passed (0 failed, 1 skipped, 0 never ran)",
        "  skipped: test_sample.py::test_failover: Skipped: no initdb",
    ]


def test_deselected_pg_tests_fail_the_check(tmp_path):
    status, summary = run_suite(tmp_path, "pass", "-m", "not pg")
    assert status == 0
    assert summary["marks"]["pg"]["collected"] == 0  # the auto-marked one went too
    assert summary["all"]["collected"] == 2
    assert problems(summary) == ["no test marked 'pg' was collected"]


def test_a_missing_report_fails_the_check(tmp_path):
    done = check(tmp_path / "absent.json")
    assert done.returncode == 1
    assert "did not finish" in done.stderr


@pytest.mark.parametrize("value", ["", "0", "-3", "many"])
def test_fuzz_examples_must_be_a_positive_integer(monkeypatch, value):
    from tests import hypothesis_budget

    monkeypatch.setenv(hypothesis_budget.FUZZ_ENV, value)
    if value == "":
        assert hypothesis_budget.examples(60) == 60
    else:
        with pytest.raises(ValueError, match="QLFLOW_FUZZ_EXAMPLES must be a positive integer"):
            hypothesis_budget.examples(60)


def test_fuzz_examples_scale_every_budget(monkeypatch):
    from tests import hypothesis_budget

    monkeypatch.delenv(hypothesis_budget.FUZZ_ENV, raising=False)
    assert [hypothesis_budget.examples(n) for n in (1, 60, 300)] == [1, 60, 300]
    monkeypatch.setenv(hypothesis_budget.FUZZ_ENV, "5000")
    assert [hypothesis_budget.examples(n) for n in (1, 60, 300)] == [50, 3000, 15000]
    monkeypatch.setenv(hypothesis_budget.FUZZ_ENV, "10")
    assert [hypothesis_budget.examples(n) for n in (1, 60, 300)] == [1, 6, 30]


@pytest.mark.parametrize(
    ("env", "profile", "derandomize", "examples"),
    [
        ({"CI": "true"}, "ci", True, 100),
        ({}, "dev", False, 100),
        ({"CI": "true", "QLFLOW_FUZZ_EXAMPLES": "700"}, "fuzz", False, 700),
    ],
)
def test_the_environment_picks_the_profile(env, profile, derandomize, examples):
    code = (
        "from hypothesis import settings\n"
        "from tests import hypothesis_budget\n"
        "name = hypothesis_budget.load_profile()\n"
        "s = settings.default\n"
        "print(name, s.derandomize, s.max_examples, s.print_blob, s.deadline)\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "QLFLOW_FUZZ_EXAMPLES")}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.split() == [profile, str(derandomize), str(examples), "True", "None"]
