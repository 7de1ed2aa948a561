"""The run report CI checks (.ci/check_report): for each tracked mark, how many
tests the run collected and how each ended, counted from the run itself.

Written as JSON to the path in QLFLOW_TEST_REPORT at the end of a session:

    {"exitstatus": 0, "marks": {"pg": {"collected": 412, "passed": 412, "failed": 0,
     "skipped": 0, "skips": []}, ...}, "all": {...}}

A test's outcome is the worst of its phases (setup, call, teardown): failed, then
skipped, then passed; a test counts as passed only once its body ran. An expected
failure (xfail) counts as skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import orjson
import pytest

REPORT_ENV = "QLFLOW_TEST_REPORT"
# pg: reaches PostgreSQL through QLFLOW_TEST_PG_URL; ha: the physical failover test
TRACKED_MARKS = ("pg", "ha")
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


class RunReport:
    """Collected and finished tests, per tracked mark."""

    def __init__(self, marks: Iterable[str]) -> None:
        self.marks = tuple(marks)
        self.items: dict[str, frozenset[str]] = {}  # node id -> its tracked marks
        self.outcomes: dict[str, str] = {}
        self.skip_reasons: dict[str, str] = {}
        self.called: set[str] = set()  # tests whose body ran

    def collected(self, items: Iterable[pytest.Item]) -> None:
        """The items this run will execute (after deselection)."""
        for item in items:
            marks = {mark.name for mark in item.iter_markers()}
            self.items[item.nodeid] = frozenset(m for m in self.marks if m in marks)

    def record(self, report: pytest.TestReport) -> None:
        """One phase's outcome of one test. Under pytest-xdist the controller collects
        nothing itself: a test's tracked marks then come with its reports."""
        if report.nodeid not in self.items:
            keywords = getattr(report, "keywords", {}) or {}
            self.items[report.nodeid] = frozenset(m for m in self.marks if m in keywords)
        outcome = "skipped" if hasattr(report, "wasxfail") else report.outcome
        if outcome not in _RANK:
            return
        before = self.outcomes.get(report.nodeid, "passed")
        self.outcomes[report.nodeid] = max(before, outcome, key=_RANK.__getitem__)
        if report.when == "call":
            self.called.add(report.nodeid)
        if outcome == "skipped" and report.nodeid not in self.skip_reasons:
            self.skip_reasons[report.nodeid] = _skip_reason(report)

    def summary(self, exitstatus: int) -> dict[str, object]:
        """The counts, per tracked mark and over all tests."""
        groups: dict[str, list[str]] = {mark: [] for mark in self.marks}
        for nodeid, marks in self.items.items():
            for mark in marks:
                groups[mark].append(nodeid)
        return {
            "exitstatus": exitstatus,
            "marks": {mark: self._counts(ids) for mark, ids in groups.items()},
            "all": self._counts(list(self.items)),
        }

    def write(self, path: str, exitstatus: int) -> None:
        """The summary as JSON at `path`."""
        Path(path).write_bytes(orjson.dumps(self.summary(exitstatus), option=orjson.OPT_INDENT_2))

    def _outcome(self, nodeid: str) -> str:
        outcome = self.outcomes.get(nodeid, "not run")
        # passed only once its body ran: a setup that passed, then an interrupted run
        if outcome == "passed" and nodeid not in self.called:
            return "not run"
        return outcome

    def _counts(self, nodeids: list[str]) -> dict[str, object]:
        ended = [self._outcome(nodeid) for nodeid in nodeids]
        skipped = [nodeid for nodeid in nodeids if self.outcomes.get(nodeid) == "skipped"]
        return {
            "collected": len(nodeids),
            "passed": ended.count("passed"),
            "failed": ended.count("failed"),
            "skipped": len(skipped),
            "not_run": ended.count("not run"),
            "skips": [f"{nodeid}: {self.skip_reasons.get(nodeid, '')}" for nodeid in skipped],
        }


def _skip_reason(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return f"xfail {report.wasxfail}".strip()
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def problems(summary: dict[str, object]) -> list[str]:
    """What makes a run's report unacceptable to CI: no test ran, or a tracked mark
    with no test, or one that did not pass (skipped, failed, never run)."""
    found: list[str] = []
    everything = summary["all"]
    assert isinstance(everything, dict)
    if everything["collected"] == 0:
        found.append("the run collected no test")
    marks = summary["marks"]
    assert isinstance(marks, dict)
    for mark in TRACKED_MARKS:
        counts = marks.get(mark)
        if not counts or counts["collected"] == 0:
            found.append(f"no test marked {mark!r} was collected")
            continue
        if counts["passed"] != counts["collected"]:
            found.append(
                f"{mark!r} tests: {counts['passed']} of {counts['collected']} passed "
                f"({counts['failed']} failed, {counts['skipped']} skipped, "
                f"{counts['not_run']} never ran)"
            )
            found += [f"  skipped: {line}" for line in counts["skips"]]
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.run_report REPORT.json`: print the counts; exit 1 on a problem."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.run_report REPORT.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    if not path.is_file():
        print(f"no run report at {path}: the test run did not finish", file=sys.stderr)
        return 1
    summary = orjson.loads(path.read_bytes())
    for mark, counts in summary["marks"].items():
        print(f"{mark}: {counts['passed']} of {counts['collected']} passed")
    found = problems(summary)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
