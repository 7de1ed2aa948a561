"""The crash matrix's quick subset (the whole matrix: `python -m bench.crash_matrix`).

For a few fault points per profile: a child process SIGKILLs itself at the point,
a fresh child recovers and drives the scenario to its end, and the final log must
equal the uncrashed reference run's — nothing lost, nothing extra, nothing changed.
The harness's own pieces are checked too: the scenario resumes at any instant
(every operation played twice gives the same log), it reaches at least 64 crash
points across every write path, and the comparison does see a lost, an extra and a
changed event.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from bench import crash_matrix as matrix

# a different handful per profile: together they span every write path's windows
QUICK = {
    "edge": [
        ("admission.after_commit", 1),
        ("complete.before_commit", 6),  # the retried failure, before its commit
        ("cancellation.after_begin", 1),
        ("recovery.after_commit", 2),
        ("renew.after_commit", 2),
        ("schedule.after_append", 2),  # the scheduled Run admitted, its cursor not moved
        ("lease_start.after_commit", 1),  # lease and start barrier committed, answer lost
        ("queue.after_append", 1),  # the queued Run dequeued with its claim, not committed
        ("complete.after_commit", 1),  # a Run's end freed its Workflow's slot, answer lost
        ("complete.before_commit", 10),  # the held Attempt's end ends the cancelled Run
    ],
    "standalone": [
        ("publish.after_commit", 1),
        ("lease.before_commit", 7),
        ("frontier.after_commit", 1),
        ("cancel.after_commit", 1),
        ("running.before_begin", 4),
        ("schedule.after_commit", 2),  # the fire committed, its answer lost
        ("lease_start.before_commit", 3),
        ("complete.after_commit", 3),  # a completion that carried its frontier
        ("limit.before_commit", 1),  # a limit set at runtime, not committed
        ("queue.after_commit", 2),  # the dequeue committed, its answer lost
        ("lease.before_commit", 3),  # a limited Task's lease takes its slot, not committed
    ],
    "cluster": [
        ("admission.before_commit", 3),
        ("complete.after_commit", 6),  # the retried failure: r back to ready
        ("cancellation.before_commit", 1),
        ("recovery.before_commit", 1),
        ("start.after_commit", 1),
        ("schedule.before_commit", 3),  # the skip of a revoked publisher's occurrence
        ("lease_start.after_begin", 1),
        ("lease.after_commit", 3),  # a limited Task's slot taken under its lock, answer lost
        ("queue.before_commit", 2),  # the dequeue under the slot's lock, not committed
        ("complete.before_commit", 3),  # the completion that frees a's slot, not committed
        ("complete.after_commit", 11),  # the held Attempt's end timed its Run out, answer lost
    ],
}
WRITE_PATHS = (
    "publish",
    "admission",
    "recovery",
    "cancellation",
    "frontier",
    "lease",
    "lease_start",
    "start",
    "running",
    "renew",
    "complete",
    "cancel",
    "withdraw",
    "quarantine",
    "revoke",
    "schedule",
    "queue",
    "limit",
)
WINDOWS = ("before_begin", "after_begin", "before_commit", "after_commit")


def _pg_server(profile: str, request) -> str | None:
    if profile != "cluster":
        return None
    return request.getfixturevalue("pg_server_url")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("crash-matrix")


@pytest.fixture(scope="module")
def references(workdir):
    """One reference run per (profile, limited), made on first use. The harness's
    self-checks use an unlimited one, so they do not depend on the resource gate."""
    made: dict[tuple[str, bool], tuple[matrix.Stores, matrix.Reference]] = {}

    def get(profile: str, pg_url: str | None, limited: bool = True):
        if (profile, limited) not in made:
            stores = matrix.Stores(profile, pg_url, workdir, slots=1)
            limit = matrix.AS_LIMIT_MIB[profile] if limited else None
            made[profile, limited] = stores, matrix.run_reference(stores, limit, workdir)
        return made[profile, limited]

    yield get
    for stores, _ in made.values():
        stores.close()


@pytest.mark.parametrize(
    ("profile", "point"),
    [
        pytest.param(profile, point, marks=[pytest.mark.pg] if profile == "cluster" else [])
        for profile, points in QUICK.items()
        for point in points
    ],
    ids=lambda value: value if isinstance(value, str) else f"{value[0]}@{value[1]}",
)
def test_a_kill_at_the_point_loses_and_duplicates_nothing(
    references, workdir, request, profile, point
) -> None:
    stores, reference = references(profile, _pg_server(profile, request))
    assert point in reference.points(), f"the scenario never reaches {point}"
    result = matrix.run_case(stores, reference, point, matrix.AS_LIMIT_MIB[profile], workdir)
    assert result.killed, result.detail
    assert (result.lost, result.extra, result.changed, result.runs_differ) == (0, 0, 0, ())
    assert result.passed, result.detail


def test_the_scenario_reaches_every_write_path_and_enough_points(references, workdir) -> None:
    _, reference = references("edge", None, limited=False)
    points = reference.points()
    assert len(points) >= matrix.MIN_POINTS
    names = {name for name, _ in points}
    missing = [f"{p}.{w}" for p in WRITE_PATHS for w in WINDOWS if f"{p}.{w}" not in names]
    assert missing == []
    assert matrix.check_expected(reference.final) == []


def test_the_scenario_retries_a_reported_failure_after_its_backoff(references) -> None:
    _, reference = references("edge", None, limited=False)
    final = reference.final
    run = final["runs"]["retry"]
    assert [a[1] for a in run["steps"]["r"]["attempts"]] == ["failed", "succeeded"]
    stream = next(s for s in final["streams"] if s == "run-" + _run_id(final, "retry"))
    ready = [e for e in final["streams"][stream] if e[2] == "step.ready" and "retry_at_ms" in e[3]]
    claims = [e for e in final["streams"][stream] if e[2] == "attempt.claimed"]
    assert len(ready) == 1 and len(claims) == 2
    assert claims[1][4]["at_ms"] >= ready[0][3]["retry_at_ms"]  # claimed once the wait was over
    assert ready[0][3]["retry_at_ms"] == matrix.T0 + 41_500


def _run_id(final, key: str) -> str:
    attempt_id = final["runs"][key]["steps"]["r"]["attempts"][0][0]
    for stream, events in final["streams"].items():
        if stream.startswith("run-") and any(e[3].get("attempt_id") == attempt_id for e in events):
            return stream.removeprefix("run-")
    raise AssertionError("no run stream names the retried Attempt")


def test_every_operation_replays_at_its_own_instant(references, workdir, tmp_path) -> None:
    """The driver's resume rule rests on this: an operation done again at its instant,
    once done, writes nothing (here: every operation played twice in a row)."""
    _, reference = references("edge", None, limited=False)
    url = f"sqlite:///{tmp_path / 'twice.db'}"
    snapshot = tmp_path / "twice.json"
    child = matrix.run_child(url, "edge", snapshot_path=snapshot, repeat=2)
    assert child.returncode == 0, child.stderr
    import orjson

    assert matrix.compare(reference.final, orjson.loads(snapshot.read_bytes())).same


def test_the_comparison_sees_lost_extra_and_changed_events(references) -> None:
    _, reference = references("edge", None, limited=False)
    final = reference.final
    assert matrix.compare(final, final).same

    lost = copy.deepcopy(final)
    lost["streams"]["publisher-" + matrix.PUBLISHER].pop()
    assert matrix.compare(final, lost).lost == 1

    extra = copy.deepcopy(final)
    stream = next(s for s in extra["streams"] if s.startswith("run-"))
    version, _, kind, data, metadata = extra["streams"][stream][-1]
    extra["streams"][stream].append([version + 1, "wff:" + "f" * 32, kind, data, metadata])
    assert matrix.compare(final, extra).extra == 1

    changed = copy.deepcopy(final)
    changed["streams"][stream][0][4] = {**changed["streams"][stream][0][4], "at_ms": 1}
    assert matrix.compare(final, changed).changed == 1

    status = copy.deepcopy(final)
    status["runs"]["ok"]["status"] = "failed"
    assert matrix.compare(final, status).runs_differ == ("ok",)


def test_percentile_is_nearest_rank() -> None:
    assert matrix.percentile([], 95) is None
    assert matrix.percentile([5.0], 95) == 5.0
    assert matrix.percentile([float(v) for v in range(1, 101)], 95) == 95.0
    assert matrix.percentile([float(v) for v in range(1, 21)], 95) == 19.0


def test_select_points_takes_the_first_and_last_hit_of_each() -> None:
    points = [("a", 1), ("a", 2), ("a", 3), ("b", 1)]
    assert matrix.select_points(points, full=False) == [("a", 1), ("a", 3), ("b", 1)]
    assert matrix.select_points(points, full=True) == points


pytestmark = pytest.mark.skipif(
    os.name != "posix", reason="the crash matrix needs POSIX signals and wait4"
)
