"""Physical HA failover with exact replay on PostgreSQL (issue 9).

    python -m bench.pg_ha

Builds, on free local ports, a fresh primary and a streaming standby made with
`pg_basebackup -R` (`synchronous_standby_names = 'standby1'`,
`synchronous_commit = remote_apply`), sets up the least-privilege roles
(actors.roles), and runs on the primary, as the runtime role through
`qlflow.open`: admission (one COMMIT response lost), Attempts, and a whole-Workflow
cancellation whose last worker completion (which ends the Run) loses its COMMIT
response. It then fences the old primary (stopped, and marked to come back only as
a standby), promotes the standby (timeline 1 -> 2) and, on the new primary, replays
the last operations and drives the other Run to its end. Finally the old primary is
brought back with `pg_rewind` as a read-only follower of the new one.

Gates: `remote_apply` (the standby held every committed event the moment each
commit returned), `timeline` ("1->2"), `exact_replay` (every replay returns the
recorded answer and writes nothing: same receipts, same statuses, the recomputed
cancellation records land on their original positions, no event id twice),
`nothing_missing` (every event id read from the old primary before fencing is on the
new one, at the same position), `continues_to_terminal`, `runtime_acl` (the runtime
role is refused provenance reads and event changes on the new primary), and
`old_primary_fenced`. Writes bench/results/pg_ha.json: {gates, passed, values}.

Server binaries: $QLFLOW_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin. Run as
root, the clusters belong to the `postgres` OS user (`runuser`).
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import errors as pg_errors
from rich.console import Console
from rich.table import Table

import qlflow
from actors import roles as pg_roles
from bench.output import results_path
from domain import run_path
from eventstore import faults
from eventstore.url import with_search_path
from projections import audit

RESULTS = results_path("pg_ha")
T0 = 1_700_000_000_000
SCHEMA = "qlflow"
PREFIX = "qlha"
STANDBY_NAME = "standby1"
REENTRY_NAME = "standby0"
OS_USER = "postgres"
START_TIMEOUT_S = 30
EXPECTED_GATES = {
    "remote_apply": True,
    "timeline": "1->2",
    "exact_replay": True,
    "nothing_missing": True,
    "continues_to_terminal": True,
    "runtime_acl": True,
    "old_primary_fenced": True,
}

MANIFEST = {
    "package": {"name": "ha", "publisher": "acme"},
    "tasks": {key: {"command": ["true"]} for key in ("a", "b", "x", "y")},
    "workflows": {
        "main": {"steps": [{"key": "a", "task": "a"}, {"key": "b", "task": "b", "needs": ["a"]}]},
        "halt": {"steps": [{"key": "x", "task": "x"}, {"key": "y", "task": "y"}]},
    },
}


# --- the clusters ------------------------------------------------------------------


def server_bindir() -> Path | None:
    """The PostgreSQL server binaries: $QLFLOW_PG_BINDIR, else the newest installed."""
    configured = os.environ.get("QLFLOW_PG_BINDIR")
    if configured:
        return Path(configured) if (Path(configured) / "initdb").is_file() else None
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(Path(path).parent.parent.name),
    )
    return Path(found[-1]).parent if found else None


def skip_reason() -> str | None:
    """Why the HA run cannot happen on this machine, or None."""
    if server_bindir() is None:
        return "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OS_USER)
        except KeyError:
            return f"running as root and there is no {OS_USER!r} OS user to own the clusters"
        if shutil.which("runuser") is None:
            return "running as root and `runuser` is missing"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Cluster:
    """One local PostgreSQL cluster: its data directory, port and socket directory."""

    name: str
    bindir: Path
    data: Path
    port: int
    sockets: Path
    log: Path

    def command(self, tool: str, *args: str) -> list[str]:
        argv = [str(self.bindir / tool), *args]
        if os.geteuid() == 0:
            return ["runuser", "-u", OS_USER, "--", *argv]
        return argv

    def run(self, tool: str, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            self.command(tool, *args), capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({done.returncode}) on {self.name}: "
                f"{done.stdout}{done.stderr}{self.log_tail()}"
            )
        return done.stdout + done.stderr

    def log_tail(self) -> str:
        try:
            return "\n--- server log ---\n" + self.log.read_text()[-3000:]
        except OSError:
            return ""

    def start(self) -> None:
        self.run(
            "pg_ctl",
            "start",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            str(START_TIMEOUT_S),
        )

    def stop(self, mode: str = "fast") -> None:
        self.run(
            "pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", str(START_TIMEOUT_S)
        )

    def promote(self) -> None:
        self.run("pg_ctl", "promote", "-D", str(self.data), "-w", "-t", str(START_TIMEOUT_S))

    def url(self, user: str = OS_USER, database: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def conninfo(self, application_name: str | None = None) -> str:
        info = f"host=127.0.0.1 port={self.port} user={OS_USER} dbname=postgres"
        return info + (f" application_name={application_name}" if application_name else "")

    def append_config(self, settings: dict[str, str]) -> None:
        """Append settings to postgresql.auto.conf (the last one read wins)."""
        lines = "".join(f"{key} = '{value}'\n" for key, value in settings.items())
        with open(self.data / "postgresql.auto.conf", "a") as conf:
            conf.write(lines)

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def query(self, statement: str, params: Any = None) -> list[tuple]:
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def kill(self) -> None:
        """Stop whatever still runs of this cluster: immediate shutdown, then SIGKILL of
        the postmaster this harness started (by its pid)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        subprocess.run(
            self.command(
                "pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t", "10"
            ),
            capture_output=True,
            timeout=30,
        )
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)
            _wait_dead(pid)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_dead(pid: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


class HaPair:
    """A primary and a synchronous (remote_apply) streaming standby in a temporary
    directory; `close` stops every server it started and removes the directory."""

    def __init__(self) -> None:
        bindir = server_bindir()
        if bindir is None:
            raise RuntimeError(skip_reason() or "no PostgreSQL server binaries")
        self.root = Path(tempfile.mkdtemp(prefix="qlflow-ha-"))
        self.clusters: list[Cluster] = []
        try:
            os.chmod(self.root, 0o700)
            if os.geteuid() == 0:
                entry = pwd.getpwnam(OS_USER)
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self.primary = self._cluster("primary", bindir)
            self.standby = self._cluster("standby", bindir)
        except BaseException:
            self.close()
            raise

    def _cluster(self, name: str, bindir: Path) -> Cluster:
        cluster = Cluster(
            name, bindir, self.root / name, _free_port(), self.root, self.root / f"{name}.log"
        )
        self.clusters.append(cluster)
        return cluster

    def build(self) -> dict[str, Any]:
        """initdb the primary, start it, clone the standby, start it, and wait until the
        primary reports it as its synchronous standby. Returns timings."""
        timings: dict[str, float] = {}
        started = time.monotonic()
        primary, standby = self.primary, self.standby
        primary.run(
            "initdb",
            "-D",
            str(primary.data),
            "-U",
            OS_USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        primary.append_config(
            {
                "listen_addresses": "127.0.0.1",
                "port": str(primary.port),
                "unix_socket_directories": str(self.root),
                "wal_level": "replica",
                "max_wal_senders": "4",
                "wal_log_hints": "on",
                "hot_standby": "on",
                "max_connections": "60",
                "synchronous_standby_names": STANDBY_NAME,
                "synchronous_commit": "remote_apply",
            }
        )
        primary.start()
        timings["primary_ready_s"] = time.monotonic() - started
        primary.run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            OS_USER,
            "-D",
            str(standby.data),
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",
            "--no-sync",
        )
        standby.append_config(
            {
                "port": str(standby.port),
                "primary_conninfo": primary.conninfo(STANDBY_NAME),
                # promoted, it has no standby of its own until the old primary re-enters
                "synchronous_standby_names": "",
            }
        )
        standby.start()
        wait_until(
            lambda: primary.query(
                "SELECT 1 FROM pg_stat_replication WHERE application_name = %s "
                "AND state = 'streaming' AND sync_state = 'sync'",
                (STANDBY_NAME,),
            ),
            "the standby to stream synchronously",
        )
        timings["pair_ready_s"] = time.monotonic() - started
        return timings

    def close(self) -> None:
        for cluster in reversed(self.clusters):
            cluster.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> HaPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(probe, what: str, timeout_s: float = 30):
    """Poll `probe` until it returns something truthy (or raise after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except psycopg.Error as error:  # a server still starting or promoting
            value, last_error = None, error
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what} (last error: {last_error})")


# --- the scenario ------------------------------------------------------------------


@dataclass
class Evidence:
    """Checks (name -> passed) and values collected along the run."""

    checks: dict[str, bool] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, passed: bool) -> bool:
        self.checks[name] = bool(passed) and self.checks.get(name, True)
        return bool(passed)

    def all(self, prefix: str) -> bool:
        chosen = [passed for name, passed in self.checks.items() if name.startswith(prefix)]
        return bool(chosen) and all(chosen)


def event_log(cluster: Cluster) -> list[tuple[int, str]]:
    """(global_position, event_id) of every event, read as the superuser."""
    return [
        (position, event_id)
        for position, event_id in cluster.query(
            f"SELECT global_position, event_id FROM {SCHEMA}.events ORDER BY global_position"
        )
    ]


def timeline(cluster: Cluster) -> int:
    return cluster.query("SELECT timeline_id FROM pg_control_checkpoint()")[0][0]


def _refused(url: str, statement: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute(statement)
    except pg_errors.InsufficientPrivilege:
        return True
    return False


def _runtime_acl(urls: pg_roles.RoleUrls) -> dict[str, bool]:
    return {
        "runtime_reads_publications": _refused(urls.runtime, "SELECT * FROM publications"),
        "runtime_reads_publishers": _refused(urls.runtime, "SELECT * FROM publishers"),
        "runtime_updates_events": _refused(urls.runtime, "UPDATE events SET type = type"),
        "runtime_deletes_events": _refused(urls.runtime, "DELETE FROM events"),
        "audit_appends": _refused(
            urls.audit,
            "INSERT INTO events VALUES (0, 'forged', 'run-forged', 1, 'x', '{}', '{}')",
        ),
    }


def _urls_on(cluster: Cluster, primary_urls: pg_roles.RoleUrls) -> pg_roles.RoleUrls:
    """The same roles' URLs on another server of the pair (roles replicate physically)."""
    names = primary_urls.roles

    def url(kind: str) -> str:
        return with_search_path(cluster.url(names[kind]), SCHEMA)

    return pg_roles.RoleUrls(
        SCHEMA, url("owner"), url("runtime"), url("publisher"), url("audit"), names
    )


def _lease_heads(rt, run_id: str) -> dict[str, str]:
    """step key -> "<lease status>@v<lease version>" of each step's last Attempt."""
    run = rt.get_run(run_id)
    heads = {}
    for key, step in run.steps.items():
        if step.attempts:
            attempt = step.attempts[-1]
            heads[key] = f"{attempt.lease_status}@v{attempt.lease_version}"
    return heads


def run_failover(pair: HaPair) -> dict[str, Any]:
    """Build the pair, run the scenario, and return the report {gates, passed, values}."""
    evidence = Evidence()
    values = evidence.values
    started = time.monotonic()
    values["seconds_since_start"] = pair.build()
    primary, standby = pair.primary, pair.standby
    values["server_version"] = primary.query("SHOW server_version")[0][0]
    values["ports"] = {"primary": primary.port, "standby": standby.port}
    values["config"] = {
        "synchronous_commit": primary.query("SHOW synchronous_commit")[0][0],
        "synchronous_standby_names": primary.query("SHOW synchronous_standby_names")[0][0],
    }
    urls = pg_roles.setup_roles(
        primary.url(), SCHEMA, PREFIX, migrate=lambda owner_url: qlflow.open(owner_url).close()
    )
    values["roles"] = dict(urls.roles)
    try:
        before = _on_primary(urls, evidence)
    finally:
        faults.disarm()
    values["seconds_since_start"]["primary_ops_s"] = time.monotonic() - started
    _fence_and_promote(pair, urls, evidence, before)
    values["seconds_since_start"]["failover_s"] = time.monotonic() - started
    _on_new_primary(pair, urls, evidence, before)
    values["seconds_since_start"]["replay_s"] = time.monotonic() - started
    _old_primary_reenters(pair, urls, evidence)
    values["seconds_since_start"]["total_s"] = time.monotonic() - started
    gates = {
        "remote_apply": evidence.all("remote_apply"),
        "timeline": f"{values['timeline_before']}->{values['timeline_after']}",
        "exact_replay": evidence.all("replay"),
        "nothing_missing": evidence.all("nothing_missing"),
        "continues_to_terminal": evidence.all("terminal"),
        "runtime_acl": evidence.all("acl"),
        "old_primary_fenced": evidence.all("fence"),
    }
    values["checks"] = evidence.checks
    return {"gates": gates, "passed": gates == EXPECTED_GATES, "values": values}


def _on_primary(urls: pg_roles.RoleUrls, evidence: Evidence) -> dict[str, Any]:
    """Everything before the failover, on the primary, as publisher-admin and runtime."""
    values = evidence.values
    with qlflow.open(urls.publisher) as publisher:
        values["publication_id"] = publisher.publish(MANIFEST, now_ms=T0).publication_id
    with qlflow.open(urls.runtime) as rt:
        main = rt.start("ha", "main", admission_key="ha-main", now_ms=T0)
        # the admission of "halt" commits, but its response is lost: start retries and
        # finds the durable receipt
        faults.arm("admission.after_commit", "raise")
        halt = rt.start("ha", "halt", admission_key="ha-halt", now_ms=T0)
        evidence.check("replay_admission_lost_response", halt.status == "existing")
        rt.cycle(now_ms=T0)
        leases = {lease.step_key: lease for lease in rt.lease_attempts("w1", limit=3, now_ms=T0)}
        evidence.check("terminal_first_leases", sorted(leases) == ["a", "x", "y"])
        for lease in leases.values():
            rt.mark_running(lease, now_ms=T0)
        rt.complete(leases["a"], "succeeded", now_ms=T0 + 1)
        rt.cycle(now_ms=T0 + 2)
        (in_flight,) = rt.lease_attempts("w2", limit=1, now_ms=T0 + 2)
        rt.mark_running(in_flight, now_ms=T0 + 2)  # b runs across the failover

        # whole-Workflow cancellation of "halt" with both Attempts running
        rt.cancel(halt.run_id, now_ms=T0 + 3)
        rt.cycle(now_ms=T0 + 4)
        waiting = rt.get_run(halt.run_id)
        evidence.check(
            "terminal_cancel_waits_for_running_workers",
            waiting.status == "running"
            and {s.status for s in waiting.steps.values()} == {"running"},
        )
        renewed_x = rt.renew(leases["x"], now_ms=T0 + 5)
        evidence.check("terminal_stop_requested", renewed_x.stop_requested)
        recorded_x = rt.complete(renewed_x, "succeeded", now_ms=T0 + 6)
        pre_completion_version = rt.get_run(halt.run_id).version
        # the last held Attempt's completion ends the Run in its commit; its answer is lost
        faults.arm("complete.after_commit", "raise")
        lost_completion = _raises(lambda: rt.complete(leases["y"], "failed", now_ms=T0 + 7))
        evidence.check("replay_completion_response_lost", lost_completion)
        faults.disarm()
        evidence.check("terminal_cycle_finds_nothing", rt.cycle(now_ms=T0 + 8).changed == 0)
        halt_run = rt.get_run(halt.run_id)
        values["primary"] = {
            "main_receipt": main.receipt_digest,
            "halt_receipt": halt.receipt_digest,
            "halt_status": halt_run.status,
            "halt_steps": {k: s.status for k, s in halt_run.steps.items()},
            "recorded_x": recorded_x,
            "main_status": rt.get_run(main.run_id).status,
        }
        evidence.check("terminal_halt_cancelled_on_primary", halt_run.status == "cancelled")
        return {
            "main": main,
            "halt": halt,
            "leases": leases,
            "renewed_x": renewed_x,
            "in_flight": in_flight,
            "recorded_x": recorded_x,
            "pre_completion_version": pre_completion_version,
        }


def _raises(call) -> bool:
    try:
        call()
    except faults.InjectedFault:
        return True
    return False


def _fence_and_promote(
    pair: HaPair, urls: pg_roles.RoleUrls, evidence: Evidence, before: dict[str, Any]
) -> None:
    values = evidence.values
    primary, standby = pair.primary, pair.standby
    # remote_apply: each commit returned only once the standby had applied it, so the
    # standby must hold every event right now, without waiting for it
    primary_log = event_log(primary)
    standby_log = event_log(standby)
    replication = primary.query(
        "SELECT application_name, state, sync_state FROM pg_stat_replication"
    )
    evidence.check("remote_apply_same_log_at_once", primary_log == standby_log)
    evidence.check(
        "remote_apply_sync_standby", replication == [(STANDBY_NAME, "streaming", "sync")]
    )
    evidence.check("remote_apply_setting", values["config"]["synchronous_commit"] == "remote_apply")
    values["events_before_failover"] = len(primary_log)
    values["replication"] = [list(row) for row in replication]
    values["timeline_before"] = timeline(standby)
    before["primary_log"] = primary_log

    # fence the old primary first: stop it, and make any restart come up as a standby
    primary.stop("fast")
    (primary.data / "standby.signal").touch()
    evidence.check("fence_refuses_connections", _connection_refused(urls.runtime))

    standby.promote()
    wait_until(lambda: standby.query("SELECT NOT pg_is_in_recovery()")[0][0], "promotion to finish")
    standby.query("CHECKPOINT")
    values["timeline_after"] = timeline(standby)
    values["wal_file_after"] = standby.query("SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0]


def _connection_refused(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.OperationalError:
        return True
    return False


def _on_new_primary(
    pair: HaPair, urls: pg_roles.RoleUrls, evidence: Evidence, before: dict[str, Any]
) -> None:
    values = evidence.values
    standby = pair.standby
    new_urls = _urls_on(standby, urls)
    old_log = before["primary_log"]
    new_log = event_log(standby)
    evidence.check("nothing_missing_ids", {e for _, e in old_log} <= {e for _, e in new_log})
    evidence.check("nothing_missing_positions", new_log[: len(old_log)] == old_log)
    acl = _runtime_acl(new_urls)
    values["runtime_acl"] = acl
    for name, refused in acl.items():
        evidence.check(f"acl_{name}", refused)

    main, halt, leases = before["main"], before["halt"], before["leases"]
    with qlflow.open(new_urls.runtime) as rt:
        head = len(event_log(standby))
        # 1. admission replays: the same receipts, status existing
        for receipt, workflow in ((main, "main"), (halt, "halt")):
            again = rt.start("ha", workflow, admission_key=receipt.admission_key, now_ms=T0)
            evidence.check(
                f"replay_admission_{workflow}",
                again.status == "existing"
                and (again.run_id, again.plan_digest, again.receipt_digest)
                == (receipt.run_id, receipt.plan_digest, receipt.receipt_digest),
            )
        # 2. completion replays: the recorded status comes back, nothing new is written
        replayed_y = rt.complete(leases["y"], "failed", now_ms=T0 + 7)
        replayed_x = rt.complete(before["renewed_x"], "succeeded", now_ms=T0 + 6)
        evidence.check("replay_completion_y", replayed_y == "cancelled")
        evidence.check("replay_completion_x", replayed_x == before["recorded_x"] == "cancelled")
        # 3. the cancel intent and a cycle, again
        evidence.check("replay_cancel_intent", rt.cancel(halt.run_id, now_ms=T0 + 3) is False)
        evidence.check("replay_convergence_cycle", rt.cycle(now_ms=T0 + 8).changed == 0)
        # 4. the lost completion (with the Run's end it carried), recomputed from the
        # state before it and appended again: an exact replay lands on the original
        # positions and writes nothing
        stored = {event_id: position for position, event_id in new_log}
        y = leases["y"]
        recomputed = {
            "completion": run_path.complete_and_advance(
                audit.aggregate_at(rt.store, halt.run_id, before["pre_completion_version"]),
                y.attempt_id,
                y.lease_id,
                y.version,
                "failed",
                None,
                None,
                T0 + 7,
            ),
        }
        values["replayed_records"] = {}
        for name, decision in recomputed.items():
            replayed = rt.store.append(decision.appends)
            evidence.check(
                f"replay_{name}_records",
                bool(replayed)
                and all(stored.get(r.event_id) == r.global_position for r in replayed),
            )
            values["replayed_records"][name] = [r.type for r in replayed]
        after_log = event_log(standby)
        evidence.check("replay_wrote_nothing", len(after_log) == head)
        ids = Counter(event_id for _, event_id in after_log)
        evidence.check("replay_no_duplicate_ids", max(ids.values()) == 1)
        evidence.check("replay_streams_contiguous", _streams_contiguous(standby))

        # the Run cancelled before the failover stays exactly as recorded
        halt_run = rt.get_run(halt.run_id)
        values["halt"] = {
            "status": halt_run.status,
            "steps": {k: s.status for k, s in halt_run.steps.items()},
            "leases": _lease_heads(rt, halt.run_id),
            "events": len([e for e in rt.events(halt.run_id)]),
        }
        evidence.check("terminal_halt_cancelled", halt_run.status == "cancelled")

        # the Attempt in flight across the failover finishes on the new primary
        renewed = rt.renew(before["in_flight"], now_ms=T0 + 9)
        evidence.check(
            "terminal_in_flight_completes",
            rt.complete(renewed, "succeeded", now_ms=T0 + 10) == "succeeded",
        )
        rt.cycle(now_ms=T0 + 11)
        main_run = rt.get_run(main.run_id)
        evidence.check("terminal_main_succeeded", main_run.status == "succeeded")
        # and new work starts and ends there
        fresh = rt.start("ha", "main", admission_key="ha-after", now_ms=T0 + 12)
        now = _drive(rt, T0 + 12)
        evidence.check("terminal_new_run", rt.get_run(fresh.run_id).status == "succeeded")
        evidence.check("replay_streams_contiguous", _streams_contiguous(standby))
        values["new_primary"] = {
            "main_status": main_run.status,
            "main_leases": _lease_heads(rt, main.run_id),
            "fresh_run_status": rt.get_run(fresh.run_id).status,
            "events_after": len(event_log(standby)),
            "finished_at_ms": now,
        }


def _streams_contiguous(cluster: Cluster) -> bool:
    versions: dict[str, list[int]] = {}
    for stream_id, version in cluster.query(
        f"SELECT stream_id, stream_version FROM {SCHEMA}.events ORDER BY global_position"
    ):
        versions.setdefault(stream_id, []).append(version)
    return all(got == list(range(1, len(got) + 1)) for got in versions.values())


def _drive(rt, now_ms: int, rounds: int = 50) -> int:
    for _ in range(rounds):
        changed = rt.cycle(now_ms=now_ms).changed
        leases = rt.lease_attempts("w3", limit=8, now_ms=now_ms)
        for lease in leases:
            rt.mark_running(lease, now_ms=now_ms)
            rt.complete(lease, "succeeded", now_ms=now_ms)
        if not changed and not leases:
            return now_ms
        now_ms += 10
    raise RuntimeError("the new Run did not settle")


def _old_primary_reenters(pair: HaPair, urls: pg_roles.RoleUrls, evidence: Evidence) -> None:
    """pg_rewind the fenced primary from the new one and start it as its read-only
    follower: it catches up, and the runtime role cannot write to it."""
    values = evidence.values
    old, new = pair.primary, pair.standby
    rewind = old.run("pg_rewind", "-D", str(old.data), "--source-server", new.conninfo())
    values["pg_rewind"] = rewind.strip().splitlines()
    old.append_config({"primary_conninfo": new.conninfo(REENTRY_NAME)})
    (old.data / "standby.signal").touch()
    old.start()
    evidence.check("fence_reentry_in_recovery", old.query("SELECT pg_is_in_recovery()")[0][0])
    expected = event_log(new)
    wait_until(lambda: event_log(old) == expected, "the old primary to catch up")
    evidence.check("fence_reentry_caught_up", event_log(old) == expected)
    old_urls = _urls_on(old, urls)
    try:
        with psycopg.connect(old_urls.runtime, connect_timeout=5) as conn:
            conn.execute("UPDATE qlflow_position SET last = last")
        read_only = False
    except pg_errors.ReadOnlySqlTransaction:
        read_only = True
    evidence.check("fence_reentry_read_only", read_only)
    receiver = old.query("SELECT received_tli, status FROM pg_stat_wal_receiver")
    values["old_primary_follows"] = [list(row) for row in receiver]


# --- command line ------------------------------------------------------------------


def render(report: dict[str, Any], console: Console) -> None:
    table = Table(title="PostgreSQL physical HA failover (qlflow)")
    table.add_column("gate")
    table.add_column("value")
    for gate, value in report["gates"].items():
        ok = value == EXPECTED_GATES[gate]
        table.add_row(gate, f"[{'green' if ok else 'red'}]{value}[/]")
    table.add_row("passed", str(report["passed"]))
    timings = report["values"].get("seconds_since_start", {})
    table.add_row("total seconds", f"{timings.get('total_s', 0):.1f}")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the same failover (it has no smaller size), but a missing harness fails",
    )
    args = parser.parse_args(argv)
    console = Console()
    reason = skip_reason()
    if reason is not None:
        console.print(f"[yellow]skipped:[/] {reason}")
        return 1 if args.smoke else 0
    with HaPair() as pair:
        report = run_failover(pair)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    render(report, console)
    console.print(f"wrote {RESULTS}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
