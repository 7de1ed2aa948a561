"""The fault-injection switchboard (eventstore.faults): off by default, counting,
n-th hit arming, unit tracking for `after_append`, watchers, and the environment
setting a child process reads at import."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import qlflow
from eventstore import faults
from tests.cycle.helpers import T0, manifest, work

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean():
    faults.disarm()
    yield
    faults.disarm()


def test_nothing_happens_and_nothing_is_counted_when_off() -> None:
    faults.hit("x.before_commit")
    faults.hit_append()
    assert faults.counts() == {}
    assert faults.current_unit() is None


def test_counting_sees_every_hit_of_every_point() -> None:
    faults.enable_counting()
    for name in ("a.before_begin", "a.after_begin", "a.after_begin", "b.after_commit"):
        faults.hit(name)
    assert faults.counts() == {"a.before_begin": 1, "a.after_begin": 2, "b.after_commit": 1}


def test_raise_fires_once_so_a_retry_gets_through() -> None:
    faults.arm("p.before_commit", "raise")
    with pytest.raises(faults.InjectedFault, match=r"p\.before_commit"):
        faults.hit("p.before_commit")
    faults.hit("p.before_commit")
    assert faults.counts()["p.before_commit"] == 2


def test_nth_fires_only_at_that_hit() -> None:
    fired: list[int] = []
    faults.arm("p.after_commit", lambda: fired.append(len(fired) + 1), nth=3)
    for _ in range(5):
        faults.hit("p.after_commit")
    assert fired == [1]
    assert faults.counts()["p.after_commit"] == 5


def test_nth_counts_from_arming() -> None:
    faults.enable_counting()
    faults.hit("p.after_begin")
    faults.hit("p.after_begin")
    faults.arm("p.after_begin", "raise", nth=1)
    with pytest.raises(faults.InjectedFault):
        faults.hit("p.after_begin")


def test_after_append_names_the_unit_open_on_this_thread() -> None:
    faults.enable_counting()
    seen: dict[str, str | None] = {}

    def other_thread() -> None:
        faults.hit("lease.before_begin")
        faults.hit("lease.after_begin")
        faults.hit_append()
        seen["other"] = faults.current_unit()

    faults.hit("complete.before_begin")
    faults.hit("complete.after_begin")
    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    faults.hit_append()
    faults.hit_append()
    faults.hit("complete.before_commit")
    faults.hit("complete.after_commit")
    assert seen["other"] == "lease"
    assert faults.current_unit() is None, "the unit ends at after_commit"
    counts = faults.counts()
    assert counts["complete.after_append"] == 2
    assert counts["lease.after_append"] == 1


def test_watchers_see_every_hit_in_order() -> None:
    names: list[str] = []
    faults.watch(names.append)
    faults.hit("u.before_begin")
    faults.hit("u.after_begin")
    assert names == ["u.before_begin", "u.after_begin"]


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("", None),
        ("count", None),
        ("complete.before_commit=kill", ("complete.before_commit", None, "kill")),
        (" lease.after_commit@12 = raise ", ("lease.after_commit", 12, "raise")),
    ],
)
def test_parse_spec(spec: str, parsed) -> None:
    assert faults.parse_spec(spec) == parsed


@pytest.mark.parametrize(
    "spec", ["kill", "x=explode", "x@0=kill", "x@two=kill", "@3=kill", "x=callable"]
)
def test_a_mistyped_setting_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        faults.parse_spec(spec)


def test_arm_refuses_unknown_actions() -> None:
    with pytest.raises(ValueError):
        faults.arm("x.after_commit", "explode")
    with pytest.raises(ValueError):
        faults.arm("x.after_commit", "kill", nth=0)


def test_the_write_paths_hit_their_points(sqlite_url) -> None:
    faults.enable_counting()
    with qlflow.open(sqlite_url, "edge") as rt:
        rt.publish(manifest([("a", []), ("b", ["a"])]), now_ms=T0)
        rt.start("demo", "flow", admission_key="k", now_ms=T0)
        rt.cycle(now_ms=T0 + 1)
        work(rt, T0 + 2)  # a's completion readies and claims b (no frontier phase)
        (lease,) = rt.lease_attempts("w2", now_ms=T0 + 3, start=True)
        rt.complete(lease, "succeeded", now_ms=T0 + 4)
        rt.cycle(now_ms=T0 + 5)
    counts = faults.counts()
    for unit in ("publish", "admission", "lease", "lease_start", "running", "complete"):
        for point in ("before_begin", "after_begin", "before_commit", "after_commit"):
            assert counts.get(f"{unit}.{point}", 0) >= 1, f"{unit}.{point}"


def _child(code: str, spec: str) -> subprocess.CompletedProcess:
    env = {**os.environ, faults.ENVIRONMENT_VARIABLE: spec, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_child_process_arms_a_kill_from_the_environment() -> None:
    code = (
        "from eventstore import faults\n"
        "for i in range(5):\n"
        "    print(i, flush=True)\n"
        "    faults.hit('p.before_commit')\n"
    )
    done = _child(code, "p.before_commit@3=kill")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1", "2"]


def test_a_child_process_refuses_a_mistyped_setting() -> None:
    done = _child("import eventstore.faults", "p.before_commit=explode")
    assert done.returncode != 0
    assert "QLFLOW_FAULT" in done.stderr
