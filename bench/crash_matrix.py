"""SIGKILL at every commit point, recover, and compare with an uncrashed run (issue 8).

    python -m bench.crash_matrix --profile edge|standalone|cluster|all [--full] [--jobs N]
                                 [--pg URL] [--no-limits] [--smoke]

The scenario. One package with four Workflows (a diamond, a pair, a single
step, a retried step) and eight Runs (a full edge page), driven with explicit `now_ms` through
the public API: publish; start the Runs; cycles; leases, start barrier, running,
renewals, completions that succeed and fail; a user cancellation while a worker
runs (its renewal answers stop_requested, its completion is recorded
cancelled and ends the Run, as the deadline Run's held completion times it out);
claims nobody leased, cancelled (reasons user and shutdown); a claim whose lease
expires before start (recovery: lost, requeued, leased again); a
started Attempt whose lease expires (lost, then failed: lease_expired); a Run
deadline (timed_out); a refused start; withdraw, quarantine and publisher
revocation; (plan v2) a ninth Run, started after the first page, whose step
fails once with an attempt left, goes back to ready, waits out its backoff through
a cycle that may not claim it, and succeeds on its second Attempt; and (flow
control) limits on the diamond's Tasks that never bind (each of their leases takes
its slot), one of them set at runtime (`limit`), and two Runs of a Workflow with
`max_running = 1`: the second is admitted into the queue, the first's end frees the
slot and a cycle's queue phase dequeues the second with its claim (`queue`). The reference
run checks every scripted answer and the final statuses (`EXPECTED`).

One case. A point is `(fault point name, n)`: the n-th hit of that point in the
scenario, enumerated by running the scenario once with hit counting on. A fresh
store; a child process runs the scenario with `QLFLOW_FAULT=<name>@<n>=kill` and
SIGKILLs itself there (it must die by SIGKILL, else the case fails); a second,
fresh child reopens the store and drives the scenario to its end; its final log
is compared with the reference run's.

Restarting. The driver always resumes: it reads the latest `metadata.at_ms` in
the log and runs every scripted operation at or after it. Each operation has its
own instant and every record it writes carries that instant, so operations
before it have all finished; the one at it may be partly done (a cycle) or done
(its response was lost), and re-running it at the same instant is an exact
replay: admission by key returns "existing"; a cycle recomputes the same records
or finds nothing left; a worker presents the lease as it stood before that
instant (rebuilt from the lease stream, as a restarted worker would) so a
repeated start, renewal or completion is answered as a replay with the same
recorded status; leasing is skipped when the log already shows the grant. A kill
before COMMIT leaves nothing, so the driver simply does the operation again under
the same (still live) lease and ids stay the same. No scripted step needs to be
left to lease expiry: the scenario's own expiries happen by design.

Comparison. Exact, per stream: every (stream, version) holds the same event id,
type, data and metadata as in the reference; no event is missing ("lost") or
added ("extra"); every Run and Step ends in the same status with the same
Attempts; the read models verify against the log. One normalization only:
global positions are not compared, because the Workflow actors of one page
commit in whatever order they reach the store, in the reference run as well.

PostgreSQL. Each case gets a fresh schema; each parallel job its own database,
because advisory locks are per database and every case uses the same ids. Before
recovering, the harness waits until the server has ended the killed client's
backends (pg_stat_activity), as a restarted replica would find them gone.

Resource gate. Children of the edge matrix run under a 128 MiB address-space
limit (RLIMIT_AS), standalone under 256 MiB (cluster: none), with the settings a
memory-limited host uses: MALLOC_ARENA_MAX=1 and 2 MiB thread stacks (glibc
would otherwise reserve 64 MiB per malloc arena and 8 MiB per thread, address
space the limit counts though it is never touched). Reported: the peak RSS of
any child (wait4 ru_maxrss), the peak address space of the children that ran to
the end (VmPeak), and the p95 write-lock hold: the time from a unit's
`after_begin` to its `before_commit` hit (its work inside the lock), and to
`after_commit` (including COMMIT), from the reference and recovery children.
Timings depend on the host's load; `--jobs` runs cases side by side.

Results: a table, and bench/results/crash_matrix.json.
"""

from __future__ import annotations

import argparse
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from bench.output import results_path

RESULTS = results_path("crash_matrix")
PROFILES = ("edge", "standalone", "cluster")
AS_LIMIT_MIB = {"edge": 128, "standalone": 256, "cluster": None}
PG_ENV = "QLFLOW_TEST_PG_URL"
FAULT_ENV = "QLFLOW_FAULT"
CHILD_TIMEOUT_S = 60.0
BACKEND_GONE_TIMEOUT_S = 15.0
MIN_POINTS = 64
SMOKE_POINTS = (("publish.after_commit", 1),)  # every profile publishes first
SMOKE_PROFILES = ("edge", "standalone")
# Thread stack of limited children. glibc's default (8 MiB, from RLIMIT_STACK) is an
# address-space reservation per thread: a page of 8 Workflow actors would reserve
# 64 MiB of a 128 MiB limit without touching it. A memory-limited host sets its
# thread stack size; so do these children.
LIMITED_THREAD_STACK_KIB = 2048

# --- the scenario ------------------------------------------------------------------------

T0 = 1_700_000_000_000
SECOND = 1_000
PACKAGE = "crashflow"
PUBLISHER = "crashlab"
MANIFEST: dict[str, Any] = {
    "package": {"name": PACKAGE, "publisher": PUBLISHER},
    "tasks": {
        **{key: {"command": ["true"]} for key in ("q", "r", "t", "x", "y", "z")},
        # flow control: a limit that never binds in the scenario, so every lease of the
        # diamond's steps takes its slot under the slot's lock (docs/DESIGN.md "Flow
        # control"); `limits set` changes b's at 12.5 s
        **{key: {"command": ["true"], "concurrency": 2} for key in ("a", "b", "c", "d")},
    },
    "workflows": {
        "diamond": {
            "steps": [
                {"key": "a", "task": "a"},
                {"key": "b", "task": "b", "needs": ["a"]},
                {"key": "c", "task": "c", "needs": ["a"]},
                {"key": "d", "task": "d", "needs": ["b", "c"]},
            ]
        },
        "pair": {"steps": [{"key": "x", "task": "x"}, {"key": "y", "task": "y", "needs": ["x"]}]},
        "solo": {"steps": [{"key": "z", "task": "z"}]},
        # every minute: armed by the cycle at 10 s for 22:14:00 (40 s), fired by the one
        # at 46 s, skipped (publisher revoked) by the one at 101 s
        "tick": {
            "steps": [{"key": "t", "task": "t"}],
            "schedules": [{"cron": "* * * * *", "timezone": "UTC"}],
        },
        # flow control: one Run at a time; the second waits in the queue until the
        # first ends (14.5 s), and the cycle at 29 s dequeues it
        "single": {"max_running": 1, "steps": [{"key": "q", "task": "q"}]},
        # plan v2: a reported failure is retried after its backoff
        "retried": {
            "steps": [
                {"key": "r", "task": "r", "retry": {"max_attempts": 2, "backoff_ms": 10 * SECOND}}
            ]
        },
    },
}

# admission key -> (final Run status, {step key: final StepRun status})
EXPECTED: dict[str, tuple[str, dict[str, str]]] = {
    "ok": ("succeeded", dict.fromkeys("abcd", "succeeded")),
    "fail": (
        "failed",
        {"a": "succeeded", "b": "succeeded", "c": "failed", "d": "skipped"},
    ),
    "cancel": ("cancelled", {"x": "cancelled", "y": "cancelled"}),
    "deadline": ("timed_out", {"z": "timed_out"}),
    "lost": ("failed", {"x": "failed", "y": "skipped"}),
    "backlog": ("cancelled", {"x": "cancelled", "y": "cancelled"}),
    "quick": ("succeeded", {"z": "succeeded"}),
    "shutdown": ("cancelled", {"z": "cancelled"}),
    "retry": ("succeeded", {"r": "succeeded"}),
    "first": ("succeeded", {"q": "succeeded"}),
    "second": ("succeeded", {"q": "succeeded"}),
}
DEADLINE_TIMEOUT_MS = 30 * SECOND  # admitted at 5 s: the deadline is 35 s


@dataclass(frozen=True, slots=True)
class Op:
    """One scripted operation at its own instant. `key` names a Run by admission key."""

    at_ms: int
    kind: str
    key: str | None = None
    step: str | None = None
    args: dict[str, Any] = field(default_factory=dict)


def scenario() -> tuple[Op, ...]:
    """The scripted operations, one instant each (seconds after T0)."""
    script: list[tuple[float, str, str | None, str | None, dict[str, Any]]] = [
        (1, "publish", None, None, {}),
        (2, "start", "ok", None, {"workflow": "diamond"}),
        (3, "start", "fail", None, {"workflow": "diamond"}),
        (4, "start", "cancel", None, {"workflow": "pair"}),
        (5, "start", "deadline", None, {"workflow": "solo", "timeout_ms": DEADLINE_TIMEOUT_MS}),
        (6, "start", "lost", None, {"workflow": "pair"}),
        (7, "start", "backlog", None, {"workflow": "pair"}),
        (8, "start", "quick", None, {"workflow": "solo"}),
        (9, "start", "shutdown", None, {"workflow": "solo"}),
        (9.2, "start", "first", None, {"workflow": "single"}),  # takes the one slot
        (9.4, "start", "second", None, {"workflow": "single"}),  # queued
        (10, "cycle", None, None, {}),  # every first step claimed: a full edge page of 8
        (11, "cancel", "backlog", None, {}),  # a claim nobody leased: backlog, cancelled
        (12, "cancel", "shutdown", None, {"reason": "shutdown"}),
        (12.5, "set_limit", None, None, {"target": "task:crashflow/b", "limit": 3}),
        (13, "lease", "quick", "z", {"worker": "w6", "ttl_ms": 30 * SECOND}),
        (13.2, "lease", "first", "q", {"worker": "w8", "ttl_ms": 30 * SECOND}),
        (13.4, "running", "first", "q", {}),
        (14, "running", "quick", "z", {}),
        # first's end frees the Workflow's slot in its own commit
        (14.5, "complete", "first", "q", {"outcome": "succeeded", "recorded": "succeeded"}),
        (15, "complete", "quick", "z", {"outcome": "succeeded", "recorded": "succeeded"}),
        (15.5, "start", "retry", None, {"workflow": "retried"}),
        # lease and start barrier in one commit (lease_start), a completion that carries
        # the frontier (ok/b, ok/c ready) and their claims
        (16, "lease", "ok", "a", {"worker": "w1", "ttl_ms": 30 * SECOND, "start": True}),
        (18, "running", "ok", "a", {}),
        (19, "complete", "ok", "a", {"outcome": "succeeded", "recorded": "succeeded"}),
        (20, "lease", "fail", "a", {"worker": "w1", "ttl_ms": 30 * SECOND}),
        (21, "running", "fail", "a", {}),  # claimed -> starting -> running in one write
        (22, "complete", "fail", "a", {"outcome": "succeeded", "recorded": "succeeded"}),
        (23, "lease", "cancel", "x", {"worker": "w2", "ttl_ms": 60 * SECOND}),
        (24, "running", "cancel", "x", {}),
        (25, "lease", "deadline", "z", {"worker": "w3", "ttl_ms": 60 * SECOND}),
        (26, "running", "deadline", "z", {}),
        (27, "lease", "lost", "x", {"worker": "w4", "ttl_ms": 5 * SECOND}),  # expires at 32
        (28, "running", "lost", "x", {}),
        (29, "cycle", None, None, {}),  # frontier: ok and fail b, c; backlog converges;
        # the queue: second takes the slot first's end freed, q claimed in that commit
        (29.2, "lease", "second", "q", {"worker": "w8", "ttl_ms": 30 * SECOND, "start": True}),
        (29.4, "complete", "second", "q", {"outcome": "succeeded", "recorded": "succeeded"}),
        (29.5, "lease", "retry", "r", {"worker": "w7", "ttl_ms": 30 * SECOND}),
        (30, "cancel", "cancel", None, {}),  # while w2 runs x
        (30.5, "running", "retry", "r", {}),
        (31, "lease", "ok", "b", {"worker": "w1", "ttl_ms": 10 * SECOND}),
        # a reported failure with an attempt left: r is ready again, its retry at 41.5 s
        (31.5, "complete", "retry", "r", {"outcome": "failed", "recorded": "failed"}),
        (32, "running", "ok", "b", {}),
        (33, "lease", "ok", "c", {"worker": "w5", "ttl_ms": 5 * SECOND}),  # never starts
        (34, "renew", "ok", "b", {"ttl_ms": 10 * SECOND, "stop": False}),
        (35, "renew", "cancel", "x", {"ttl_ms": 60 * SECOND, "stop": True}),
        (36, "cycle", None, None, {}),  # lost/x expired: failed; deadline reached; r waits
        (37, "lease", "fail", "b", {"worker": "w1", "ttl_ms": 30 * SECOND}),
        (38, "running", "fail", "b", {}),
        (39, "complete", "fail", "b", {"outcome": "succeeded", "recorded": "succeeded"}),
        (40, "lease", "fail", "c", {"worker": "w1", "ttl_ms": 30 * SECOND}),
        (41, "starting", "fail", "c", {}),
        (42, "complete", "fail", "c", {"outcome": "failed", "recorded": "failed"}),
        (43, "complete", "ok", "b", {"outcome": "succeeded", "recorded": "succeeded"}),
        # the last held Attempts: each completion ends its Run (cancelled, timed out)
        (44, "complete", "cancel", "x", {"outcome": "succeeded", "recorded": "cancelled"}),
        (45, "complete", "deadline", "z", {"outcome": "succeeded", "recorded": "timed_out"}),
        (46, "cycle", None, None, {}),  # ok/c's claim expired: lost, requeued, claimed again
        # (and r's retry is due: its second Attempt is claimed)
        (46.5, "lease", "retry", "r", {"worker": "w7", "ttl_ms": 30 * SECOND}),
        (47, "lease", "ok", "c", {"worker": "w1", "ttl_ms": 30 * SECOND, "start": True}),
        (47.5, "running", "retry", "r", {}),
        (48.5, "complete", "retry", "r", {"outcome": "succeeded", "recorded": "succeeded"}),
        (49, "running", "ok", "c", {}),
        (50, "complete", "ok", "c", {"outcome": "succeeded", "recorded": "succeeded"}),
        (51, "cycle", None, None, {}),  # ok/d ready and claimed
        (52, "lease", "ok", "d", {"worker": "w2", "ttl_ms": 30 * SECOND}),
        (53, "running", "ok", "d", {}),
        (54, "renew", "ok", "d", {"ttl_ms": 30 * SECOND, "stop": False}),
        (55, "complete", "ok", "d", {"outcome": "succeeded", "recorded": "succeeded"}),
        (56, "cycle", None, None, {}),
        # a rerun of the failed diamond: a, b reused, c and d run again (admission commit)
        (56.5, "rerun", "fail", None, {"admission_key": "fail-rerun"}),
        (57, "withdraw", None, None, {}),
        (58, "start_refused", "late", None, {"workflow": "pair"}),
        (59, "quarantine", None, None, {}),
        (60, "revoke", None, None, {}),
        (61, "cycle", None, None, {}),
        (101, "cycle", None, None, {}),  # the schedule's 22:15:00 is skipped: revoked
    ]
    instants = [seconds for seconds, *_ in script]
    assert instants == sorted(set(instants)), "the driver resumes in time order: keep it so"
    return tuple(
        Op(T0 + int(seconds * SECOND), kind, key, step, args)
        for seconds, kind, key, step, args in script
    )


class ScenarioError(AssertionError):
    """The store answered differently from what the scenario scripts."""


class Driver:
    """Drives the scenario on an opened runtime, resuming after whatever is durable."""

    def __init__(self, rt, repeat: int = 1) -> None:
        self.rt = rt
        self.repeat = repeat  # >1: every operation again at once (an idempotence self-check)

    def run(self, ops: Sequence[Op]) -> None:
        resume_at = latest_instant(self.rt)
        for op in ops:
            if op.at_ms < resume_at:
                continue
            for _ in range(self.repeat):
                getattr(self, f"_{op.kind}")(op)

    # -- operations -------------------------------------------------------------------

    def _publish(self, op: Op) -> None:
        self.rt.publish(MANIFEST, now_ms=op.at_ms)

    def _start(self, op: Op) -> None:
        self.rt.start(
            PACKAGE,
            op.args["workflow"],
            admission_key=op.key,
            timeout_ms=op.args.get("timeout_ms"),
            now_ms=op.at_ms,
        )

    def _rerun(self, op: Op) -> None:
        receipt = self.rt.rerun(
            self.run_id(op.key), admission_key=op.args["admission_key"], now_ms=op.at_ms
        )
        reused = {k for k, s in self.rt.get_run(receipt.run_id).steps.items() if s.reused_from}
        if reused != {"a", "b"}:
            raise ScenarioError(f"{op}: the rerun reused {sorted(reused)}, not a and b")

    def _start_refused(self, op: Op) -> None:
        from qlflow.errors import StartGuardError

        try:
            self.rt.start(PACKAGE, op.args["workflow"], admission_key=op.key, now_ms=op.at_ms)
        except StartGuardError:
            return
        raise ScenarioError(f"{op}: a start from a withdrawn publication was admitted")

    def _cycle(self, op: Op) -> None:
        result = self.rt.cycle(now_ms=op.at_ms)
        errors = [
            e
            for phase in ("recovery", "cancellation", "schedule", "queue", "frontier", "claim")
            for e in getattr(result, phase).errors
        ]
        if errors:
            raise ScenarioError(f"{op}: cycle errors {errors}")

    def _set_limit(self, op: Op) -> None:
        self.rt.set_limit(op.args["target"], op.args["limit"], by=PUBLISHER, now_ms=op.at_ms)

    def _cancel(self, op: Op) -> None:
        reason = op.args.get("reason", "user")
        self.rt.cancel(self.run_id(op.key), reason=reason, now_ms=op.at_ms)

    def _lease(self, op: Op) -> None:
        run_id = self.run_id(op.key)
        leases = self.rt.lease_attempts(
            op.args["worker"],
            limit=1,
            ttl_ms=op.args["ttl_ms"],
            now_ms=op.at_ms,
            run_id=run_id,
            step_key=op.step,
            start=op.args.get("start", False),
        )
        if leases:
            return
        granted = [
            r
            for r in self.rt.events(run_id, types=["lease.granted"], since_ms=op.at_ms)
            if r.metadata["at_ms"] == op.at_ms and r.data["step_key"] == op.step
        ]
        if not granted:
            raise ScenarioError(f"{op}: no lease granted, and none in the log")

    def _starting(self, op: Op) -> None:
        self.rt.mark_starting(self.lease_before(op), now_ms=op.at_ms)

    def _running(self, op: Op) -> None:
        self.rt.mark_running(self.lease_before(op), now_ms=op.at_ms)

    def _renew(self, op: Op) -> None:
        renewed = self.rt.renew(self.lease_before(op), op.args["ttl_ms"], now_ms=op.at_ms)
        if renewed.expires_at_ms != op.at_ms + op.args["ttl_ms"]:
            raise ScenarioError(f"{op}: renewed until {renewed.expires_at_ms}")
        if renewed.stop_requested != op.args["stop"]:
            raise ScenarioError(f"{op}: stop_requested is {renewed.stop_requested}")

    def _complete(self, op: Op) -> None:
        recorded = self.rt.complete(self.lease_before(op), op.args["outcome"], now_ms=op.at_ms)
        if recorded != op.args["recorded"]:
            raise ScenarioError(f"{op}: recorded {recorded!r}")

    def _withdraw(self, op: Op) -> None:
        self.rt.withdraw(self.publication_id(), now_ms=op.at_ms)

    def _quarantine(self, op: Op) -> None:
        self.rt.quarantine(self.publication_id(), now_ms=op.at_ms)

    def _revoke(self, op: Op) -> None:
        self.rt.revoke_publisher(PUBLISHER, now_ms=op.at_ms)

    # -- what the durable state says ----------------------------------------------------

    def run_id(self, key: str | None) -> str:
        receipt = self.rt.inspect_admission(admission_key=key)
        if receipt is None:
            raise ScenarioError(f"no admission receipt for key {key!r}")
        return receipt.run_id

    def publication_id(self) -> str:
        return self.rt.get_run(self.run_id("ok")).publication_id

    def lease_before(self, op: Op):
        """The worker's lease on the step's latest Attempt as it stood before `op`:
        what a worker that lost the answer of this very operation still holds."""
        import qlflow

        run_id = self.run_id(op.key)
        step = self.rt.get_run(run_id).steps[op.step]
        attempt = step.attempts[-1]
        held = [
            r
            for r in self.rt.events(
                run_id, types=["lease.granted", "lease.renewed"], until_ms=op.at_ms
            )
            if r.stream_id == f"lease-{attempt.attempt_id}"
        ]
        if not held:
            raise ScenarioError(f"{op}: Attempt {attempt.attempt_id} was never leased")
        grant = next(r for r in reversed(held) if r.type == "lease.granted")
        last = held[-1]
        return qlflow.Lease(
            lease_id=grant.data["lease_id"],
            attempt_id=attempt.attempt_id,
            run_id=run_id,
            step_key=op.step,
            task_ref=step.task_ref,
            version=last.stream_version,
            expires_at_ms=last.data["expires_at_ms"],
            worker_id=grant.data["worker_id"],
        )


def latest_instant(rt) -> int:
    """The latest `metadata.at_ms` in the log (-1 for an empty log)."""
    latest = -1
    for record in rt.events():
        latest = max(latest, record.metadata["at_ms"])
    return latest


def snapshot(rt) -> dict[str, Any]:
    """The final log per stream (positions left out), the Runs, and projection health."""
    streams: dict[str, list[list[Any]]] = {}
    for r in rt.events():
        streams.setdefault(r.stream_id, []).append(
            [r.stream_version, r.event_id, r.type, r.data, r.metadata]
        )
    runs = {}
    for key in EXPECTED:
        receipt = rt.inspect_admission(admission_key=key)
        if receipt is None:
            runs[key] = None
            continue
        view = rt.get_run(receipt.run_id)
        runs[key] = {
            "status": view.status,
            "version": view.version,
            "error_code": view.error_code,
            "cancel_reason": view.cancel_reason,
            "steps": {
                step_key: {
                    "status": step.status,
                    "result_code": step.result_code,
                    "epoch": step.epoch,
                    "attempts": [
                        [a.attempt_id, a.status, a.lease_id, a.lease_version, a.lease_status]
                        for a in step.attempts
                    ],
                }
                for step_key, step in view.steps.items()
            },
        }
    return {"streams": streams, "runs": runs, "verified": rt.verify_projections().ok}


def check_expected(final: dict[str, Any]) -> list[str]:
    """Where the final Runs differ from the scripted outcome (empty: as scripted)."""
    problems = []
    for key, (status, steps) in EXPECTED.items():
        run = final["runs"].get(key)
        if run is None:
            problems.append(f"run {key!r} was never admitted")
            continue
        if run["status"] != status:
            problems.append(f"run {key!r} is {run['status']}, expected {status}")
        got = {k: s["status"] for k, s in run["steps"].items()}
        if got != steps:
            problems.append(f"run {key!r} steps {got}, expected {steps}")
    if not final["verified"]:
        problems.append("the read models do not verify against the log")
    return problems


@dataclass(frozen=True, slots=True)
class Comparison:
    """How a recovered log differs from the reference log."""

    lost: int
    extra: int
    changed: int
    runs_differ: tuple[str, ...]
    verified: bool

    @property
    def same(self) -> bool:
        return not (self.lost or self.extra or self.changed or self.runs_differ) and self.verified


def compare(reference: dict[str, Any], recovered: dict[str, Any]) -> Comparison:
    """Exact comparison per (stream, version); see the module docstring."""

    def by_id(final):
        return {
            entry[1]: (stream, *entry[:1], *entry[2:])
            for stream, entries in final["streams"].items()
            for entry in entries
        }

    want, got = by_id(reference), by_id(recovered)
    runs_differ = tuple(
        key for key in EXPECTED if reference["runs"].get(key) != recovered["runs"].get(key)
    )
    return Comparison(
        lost=len(want.keys() - got.keys()),
        extra=len(got.keys() - want.keys()),
        changed=sum(1 for event_id in want.keys() & got.keys() if want[event_id] != got[event_id]),
        runs_differ=runs_differ,
        verified=recovered["verified"],
    )


# --- the child process ---------------------------------------------------------------------


class LockTimer:
    """Times each unit of work from `after_begin` to `before_commit` / `after_commit`."""

    def __init__(self) -> None:
        self.began = threading.local()
        self.hold_ms: list[float] = []
        self.through_commit_ms: list[float] = []

    def __call__(self, name: str) -> None:
        point = name.rpartition(".")[2]
        now = time.perf_counter()
        if point == "after_begin":
            self.began.at = now
        elif point == "before_commit" and getattr(self.began, "at", None) is not None:
            self.hold_ms.append((now - self.began.at) * 1000)
        elif point == "after_commit" and getattr(self.began, "at", None) is not None:
            self.through_commit_ms.append((now - self.began.at) * 1000)
            self.began.at = None


def child_main(args: argparse.Namespace) -> int:
    """Run (or resume) the scenario on `args.url`; write what was asked for."""
    if args.as_limit_mib:
        limit = args.as_limit_mib * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        threading.stack_size(LIMITED_THREAD_STACK_KIB * 1024)
    import orjson

    import qlflow
    from eventstore import faults

    timer = None
    if args.timings:
        timer = LockTimer()
        faults.watch(timer)
    rt = qlflow.open(args.url, args.profile)
    try:
        Driver(rt, repeat=args.repeat).run(scenario())
        if args.snapshot:
            Path(args.snapshot).write_bytes(orjson.dumps(snapshot(rt)))
    finally:
        rt.close()
    if args.counts:
        Path(args.counts).write_bytes(orjson.dumps(faults.counts()))
    if timer is not None:
        Path(args.timings).write_bytes(
            orjson.dumps(
                {
                    "hold_ms": timer.hold_ms,
                    "through_commit_ms": timer.through_commit_ms,
                    "vm_peak_kb": _vm_peak_kb(),
                }
            )
        )
    return 0


def _vm_peak_kb() -> int:
    """This process's peak address-space size (what RLIMIT_AS limits), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmPeak:"):
            return int(line.split()[1])
    return 0


# --- the orchestrator ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildRun:
    """How one child process ended."""

    returncode: int  # negative: killed by that signal
    maxrss_kb: int
    stderr: str
    timed_out: bool = False  # it hung, and the harness killed it

    @property
    def killed_itself(self) -> bool:
        """Died by SIGKILL at its fault point (not by the harness's timeout)."""
        return self.returncode == -signal.SIGKILL and not self.timed_out


def run_child(
    url: str,
    profile: str,
    *,
    fault: str | None = None,
    snapshot_path: Path | None = None,
    counts_path: Path | None = None,
    timings_path: Path | None = None,
    as_limit_mib: int | None = None,
    repeat: int = 1,
) -> ChildRun:
    """Run the scenario in a fresh interpreter; wait4 gives its own peak RSS."""
    command = [
        sys.executable,
        "-m",
        "bench.crash_matrix",
        "--child",
        "--url",
        url,
        "--profile",
        profile,
        "--repeat",
        str(repeat),
    ]
    for flag, value in (
        ("--snapshot", snapshot_path),
        ("--counts", counts_path),
        ("--timings", timings_path),
        ("--as-limit-mib", as_limit_mib),
    ):
        if value is not None:
            command += [flag, str(value)]
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault is not None:
        env[FAULT_ENV] = fault
    if as_limit_mib is not None:
        # glibc reserves 64 MiB of address space per extra malloc arena (up to 8 per
        # core); an address-space limit counts the reservation, not memory use. Under
        # the GIL more arenas buy nothing, so a memory-limited host runs with one.
        env.setdefault("MALLOC_ARENA_MAX", "1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")) if p
    )
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env
        )
        status, usage, timed_out = _wait4(process, CHILD_TIMEOUT_S)
        stderr.seek(0)
        text = stderr.read().decode(errors="replace")
    if timed_out:
        text += f"\n[crash_matrix: the child hung for {CHILD_TIMEOUT_S:g}s and was killed]"
    return ChildRun(os.waitstatus_to_exitcode(status), usage.ru_maxrss, text[-4000:], timed_out)


def _wait4(process: subprocess.Popen, timeout_s: float):
    """Reap the child with its own rusage; kill it if it outlives `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid == process.pid:
            process.returncode = os.waitstatus_to_exitcode(status)  # Popen must not reap it
            return status, usage, False
        if time.monotonic() > deadline:
            process.kill()
            pid, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            return status, usage, True
        time.sleep(0.01)


class Stores:
    """Fresh stores for one profile: SQLite files in a temp folder, or PostgreSQL schemas.

    PostgreSQL advisory locks belong to a database, not a schema, and every case uses
    the same ids (that is the point): cases running side by side in one database
    would meet each other's locks. So each parallel slot gets its own database, made
    for this matrix and dropped with it; a case takes a fresh schema in a free one.
    """

    def __init__(self, profile: str, pg_url: str | None, root: Path, slots: int = 1) -> None:
        self.profile = profile
        self.pg_url = pg_url
        self.root = root
        self._free: queue.Queue[str] = queue.Queue()
        self._databases: list[str] = []
        if profile != "cluster":
            return
        if not pg_url:
            raise SystemExit(f"the cluster profile needs PostgreSQL: set {PG_ENV} or pass --pg")
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as conn:
            for _ in range(max(1, slots)):
                database = f"qlflow_crash_{uuid.uuid4().hex[:12]}"
                conn.execute(f"CREATE DATABASE {database}")
                self._databases.append(database)
                self._free.put(urlunsplit(urlsplit(pg_url)._replace(path=f"/{database}")))

    def close(self) -> None:
        """Drop the databases made for this matrix."""
        if not self._databases:
            return
        import psycopg

        assert self.pg_url is not None
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            for database in self._databases:
                conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        self._databases.clear()

    def __enter__(self) -> Stores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def fresh(self) -> Iterator[tuple[str, Callable[[], None]]]:
        """(url, wait_for_the_dead) of a fresh, empty store, removed afterwards."""
        name = f"cm_{uuid.uuid4().hex[:16]}"
        if self.profile != "cluster":
            folder = self.root / name
            folder.mkdir()
            try:
                yield f"sqlite:///{folder / 'qlflow.db'}", lambda: None
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            return
        import psycopg

        server = self._free.get()
        try:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {name}")

            def wait_for_the_dead() -> None:
                # the server ends a killed client's backends (and frees their locks) when
                # it sees the socket close; the next child must not meet them
                deadline = time.monotonic() + BACKEND_GONE_TIMEOUT_S
                with psycopg.connect(server, autocommit=True) as conn:
                    while time.monotonic() < deadline:
                        row = conn.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                            (name,),
                        ).fetchone()
                        if row is not None and row[0] == 0:
                            return
                        time.sleep(0.02)
                raise TimeoutError(f"backends of killed client {name} are still alive")

            try:
                yield _pg_url(server, name, application_name=name), wait_for_the_dead
            finally:
                with psycopg.connect(server, autocommit=True) as conn:
                    conn.execute("SET lock_timeout = '10s'")
                    conn.execute(f"DROP SCHEMA {name} CASCADE")
        finally:
            self._free.put(server)


def _pg_url(server_url: str, schema: str, *, application_name: str) -> str:
    from eventstore.url import with_search_path

    parts = urlsplit(with_search_path(server_url, schema))
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "application_name"]
    query.append(("application_name", application_name))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


@dataclass(frozen=True, slots=True)
class Reference:
    """The uncrashed run of one profile: its final log and every point it hit."""

    final: dict[str, Any]
    counts: dict[str, int]
    child: ChildRun
    timings: dict[str, list[float]]

    def points(self) -> list[tuple[str, int]]:
        """Every (point, n): the n-th hit of each point, in name order."""
        return [(name, n) for name in sorted(self.counts) for n in range(1, self.counts[name] + 1)]


def run_reference(stores: Stores, as_limit_mib: int | None, workdir: Path) -> Reference:
    """Run the scenario once, uncrashed, counting every fault point."""
    import orjson

    with stores.fresh() as (url, _):
        tag = uuid.uuid4().hex[:8]
        paths = [workdir / f"reference-{tag}.{suffix}" for suffix in ("json", "counts", "times")]
        child = run_child(
            url,
            stores.profile,
            fault="count",
            snapshot_path=paths[0],
            counts_path=paths[1],
            timings_path=paths[2],
            as_limit_mib=as_limit_mib,
        )
        if child.returncode != 0:
            raise RuntimeError(f"the reference run failed ({child.returncode}):\n{child.stderr}")
        final, counts, timings = (orjson.loads(p.read_bytes()) for p in paths)
    problems = check_expected(final)
    if problems:
        raise RuntimeError("the reference run did not end as scripted: " + "; ".join(problems))
    return Reference(final, counts, child, timings)


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One crash point of one profile."""

    point: str
    nth: int
    passed: bool
    killed: bool
    lost: int = 0
    extra: int = 0
    changed: int = 0
    runs_differ: tuple[str, ...] = ()
    detail: str = ""
    peak_rss_kb: int = 0
    timings: dict[str, list[float]] = field(default_factory=dict)


def run_case(
    stores: Stores,
    reference: Reference,
    point: tuple[str, int],
    as_limit_mib: int | None,
    workdir: Path,
) -> CaseResult:
    """Kill the scenario at `point`, recover in a fresh process, compare with the reference."""
    import orjson

    name, nth = point
    tag = uuid.uuid4().hex[:12]
    snapshot_path = workdir / f"{tag}.json"
    timings_path = workdir / f"{tag}.times"
    with stores.fresh() as (url, wait_for_the_dead):
        crashed = run_child(
            url, stores.profile, fault=f"{name}@{nth}=kill", as_limit_mib=as_limit_mib
        )
        killed = crashed.killed_itself
        if not killed:
            return CaseResult(
                name,
                nth,
                False,
                False,
                detail=(
                    f"the child was not killed at the point (exit {crashed.returncode}): "
                    f"{crashed.stderr.strip()[-1500:]}"
                ),
                peak_rss_kb=crashed.maxrss_kb,
            )
        wait_for_the_dead()
        recovered = run_child(
            url,
            stores.profile,
            snapshot_path=snapshot_path,
            timings_path=timings_path,
            as_limit_mib=as_limit_mib,
            fault="count",
        )
        peak = max(crashed.maxrss_kb, recovered.maxrss_kb)
        if recovered.returncode != 0:
            return CaseResult(
                name,
                nth,
                False,
                True,
                detail=(
                    f"recovery failed (exit {recovered.returncode}): "
                    f"{recovered.stderr.strip()[-1500:]}"
                ),
                peak_rss_kb=peak,
            )
        final = orjson.loads(snapshot_path.read_bytes())
        timings = orjson.loads(timings_path.read_bytes())
    diff = compare(reference.final, final)
    return CaseResult(
        name,
        nth,
        diff.same,
        True,
        diff.lost,
        diff.extra,
        diff.changed,
        diff.runs_differ,
        "" if diff.same else f"differs from the reference: {diff}",
        peak,
        timings,
    )


def select_points(points: Sequence[tuple[str, int]], full: bool) -> list[tuple[str, int]]:
    """All points with `full`; otherwise the first and the last hit of every point name
    (every kind of window, at both ends of the scenario)."""
    if full:
        return list(points)
    last: dict[str, int] = {}
    for name, n in points:
        last[name] = max(n, last.get(name, 0))
    chosen = [(name, n) for name, n in points if n in (1, last[name])]
    return chosen


@dataclass
class ProfileReport:
    """Everything one profile's matrix measured."""

    profile: str
    points_total: int
    cases: list[CaseResult]
    reference_peak_rss_kb: int
    as_limit_mib: int | None
    seconds: float
    hold_ms: list[float] = field(default_factory=list)
    through_commit_ms: list[float] = field(default_factory=list)
    vm_peak_kb: int = 0  # of the children that finished (a killed one cannot report)

    @property
    def passed(self) -> int:
        return sum(case.passed for case in self.cases)

    @property
    def peak_rss_kb(self) -> int:
        return max([self.reference_peak_rss_kb, *(case.peak_rss_kb for case in self.cases)])

    def summary(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "distinct_points": len({case.point for case in self.cases}),
            "points_enumerated": self.points_total,
            "cases": len(self.cases),
            "passed": self.passed,
            "failed": len(self.cases) - self.passed,
            "lost": sum(case.lost for case in self.cases),
            "extra": sum(case.extra for case in self.cases),
            "changed": sum(case.changed for case in self.cases),
            "address_space_limit_mib": self.as_limit_mib,
            "peak_rss_mib": round(self.peak_rss_kb / 1024, 1),
            "peak_address_space_mib": round(self.vm_peak_kb / 1024, 1),
            "write_lock_hold_p95_ms": percentile(self.hold_ms, 95),
            "write_lock_hold_through_commit_p95_ms": percentile(self.through_commit_ms, 95),
            "transactions_timed": len(self.hold_ms),
            "seconds": round(self.seconds, 1),
            "failures": [
                {"point": c.point, "nth": c.nth, "detail": c.detail}
                for c in self.cases
                if not c.passed
            ],
        }


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile, rounded to µs (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return round(ordered[int(rank) - 1], 3)


def run_profile(
    profile: str,
    *,
    full: bool = False,
    jobs: int = 1,
    pg_url: str | None = None,
    limits: bool = True,
    points: Sequence[tuple[str, int]] | None = None,
    progress: Callable[[CaseResult], None] | None = None,
) -> ProfileReport:
    """Run one profile's matrix (or just `points`)."""
    started = time.monotonic()
    as_limit = AS_LIMIT_MIB[profile] if limits else None
    with (
        tempfile.TemporaryDirectory(prefix=f"crash-{profile}-") as tmp,
        Stores(profile, pg_url, Path(tmp), slots=jobs) as stores,
    ):
        root = Path(tmp)
        reference = run_reference(stores, as_limit, root)
        enumerated = reference.points()
        chosen = list(points) if points is not None else select_points(enumerated, full)
        unknown = [p for p in chosen if p not in enumerated]
        if unknown:
            raise ValueError(f"the scenario never reaches {unknown}")

        def one(point):
            result = run_case(stores, reference, point, as_limit, root)
            if progress is not None:
                progress(result)
            return result

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            cases = list(pool.map(one, chosen))
    report = ProfileReport(
        profile,
        len(enumerated),
        cases,
        reference.child.maxrss_kb,
        as_limit,
        time.monotonic() - started,
    )
    for timings in [reference.timings, *(case.timings for case in cases)]:
        report.hold_ms.extend(timings.get("hold_ms", ()))
        report.through_commit_ms.extend(timings.get("through_commit_ms", ()))
        report.vm_peak_kb = max(report.vm_peak_kb, timings.get("vm_peak_kb", 0))
    return report


class Progress:
    """Reports each failed case at once, and a count every 25 cases, on stderr."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.done = 0
        self._lock = threading.Lock()

    def __call__(self, case: CaseResult) -> None:
        with self._lock:
            self.done += 1
            if not case.passed:
                print(
                    f"{self.profile} {case.point}@{case.nth} FAILED: {case.detail}",
                    file=sys.stderr,
                    flush=True,
                )
            if self.done % 25 == 0:
                print(f"{self.profile}: {self.done} cases", file=sys.stderr, flush=True)


def render(reports: Sequence[ProfileReport]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="crash matrix: SIGKILL at a commit point, recover, compare")
    for column in (
        "profile",
        "points",
        "cases",
        "passed",
        "lost",
        "extra",
        "changed",
        "AS limit",
        "peak RSS",
        "peak AS",
        "lock p95",
        "+COMMIT p95",
        "seconds",
    ):
        table.add_column(column, justify="left" if column == "profile" else "right")
    for report in reports:
        s = report.summary()
        table.add_row(
            s["profile"],
            f"{s['distinct_points']} ({s['points_enumerated']} hits)",
            str(s["cases"]),
            str(s["passed"]),
            str(s["lost"]),
            str(s["extra"]),
            str(s["changed"]),
            f"{s['address_space_limit_mib']} MiB" if s["address_space_limit_mib"] else "-",
            f"{s['peak_rss_mib']} MiB",
            f"{s['peak_address_space_mib']} MiB",
            f"{s['write_lock_hold_p95_ms']} ms",
            f"{s['write_lock_hold_through_commit_p95_ms']} ms",
            str(s["seconds"]),
        )
    console = Console(width=160)
    console.print(table)
    for report in reports:
        for failure in report.summary()["failures"]:
            console.print(
                f"[red]{report.profile} {failure['point']}@{failure['nth']}[/red]: "
                f"{failure['detail']}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.crash_matrix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profile", default="all", choices=(*PROFILES, "all"))
    parser.add_argument(
        "--full",
        action="store_true",
        help="every hit of every point (default: first and last hit of each)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one point per profile, edge and standalone unless --profile names one: does "
        "the harness still run (the cluster profile's database per job takes a minute)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--pg", default=os.environ.get(PG_ENV))
    parser.add_argument("--no-limits", action="store_true", help="no address-space limits")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    parser.add_argument("--counts", help=argparse.SUPPRESS)
    parser.add_argument("--timings", help=argparse.SUPPRESS)
    parser.add_argument("--as-limit-mib", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)

    profiles = PROFILES if args.profile == "all" else (args.profile,)
    if args.smoke and args.profile == "all":
        profiles = SMOKE_PROFILES
    reports = []
    for profile in profiles:
        if profile == "cluster" and not args.pg:
            print(f"cluster skipped: set {PG_ENV} or pass --pg", file=sys.stderr)
            continue
        reports.append(
            run_profile(
                profile,
                full=args.full,
                jobs=args.jobs,
                pg_url=args.pg,
                limits=not args.no_limits,
                points=SMOKE_POINTS if args.smoke else None,
                progress=Progress(profile),
            )
        )
    render(reports)
    import orjson

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(
        orjson.dumps(
            {
                "full": args.full,
                "smoke": args.smoke,
                "jobs": args.jobs,
                "cpus": os.cpu_count(),
                "load_average_1m_at_end": round(os.getloadavg()[0], 2),
                "profiles": [report.summary() for report in reports],
            },
            option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE,
        )
    )
    return 0 if all(r.passed == len(r.cases) for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
