"""Round trips per PostgreSQL call, counted on the wire.

    python -m bench.roundtrips [--pg URL] [--label after] [--steps 4]

Runs qlflow on a fresh schema through a small TCP proxy that counts, per
connection, how often the client starts sending after the server last answered: one
round trip each. So pipelined statements are one, a BEGIN riding with the first
statement costs nothing extra, and the pool's connection check counts like any
query. It measures store appends (one stream, three streams, each a whole
transaction), then a Run of `--steps` independent steps: admission, the cycle that
claims them, and per step the lease, the start barrier and the completion. The
figures are the same on every run (they count messages, not time).

Prints a table and writes bench/results/roundtrips-<label>.json. Only public API is
used, so the same file measures an older checkout (`PYTHONPATH=<checkout>`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import psycopg
from rich.console import Console
from rich.table import Table

import qlflow
from bench import peers
from bench.output import results_dir
from domain.records import NewEvent, StreamAppend
from eventstore.url import with_search_path

RESULTS = results_dir()
T0 = 1_700_000_000_000


class CountingProxy:
    """A TCP proxy to the server that counts client-to-server turns (round trips)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self.round_trips = 0
        self.bytes_sent = 0  # client to server
        self.bytes_received = 0  # server to client
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            state = {"client_turn": False}
            threading.Thread(
                target=self._pipe, args=(client, server, state, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pipe, args=(server, client, state, False), daemon=True
            ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, state: dict, upstream: bool):
        try:
            while data := source.recv(65536):
                with self._lock:
                    if upstream and not state["client_turn"]:
                        self.round_trips += 1
                    state["client_turn"] = upstream
                    if upstream:
                        self.bytes_sent += len(data)
                    else:
                        self.bytes_received += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def count(self, call: Callable[[], Any]) -> tuple[int, Any]:
        with self._lock:
            before = self.round_trips
        result = call()
        with self._lock:
            return self.round_trips - before, result

    def totals(self) -> tuple[int, int]:
        """(round trips, bytes either way) so far."""
        with self._lock:
            return self.round_trips, self.bytes_sent + self.bytes_received

    def close(self) -> None:
        self._listener.close()


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _event(n: int) -> NewEvent:
    return NewEvent(
        event_id=f"bench-{uuid.uuid4().hex[:24]}",
        type="bench.event",
        data={"n": n},
        metadata={"at_ms": T0, "causation_id": None, "correlation_id": None, "actor": "bench"},
    )


def _manifest(steps: int, chain: bool = False) -> str:
    """`steps` independent steps of package rt, or (`chain`) each needing the one before,
    package rtc."""
    name = "rtc" if chain else "rt"
    lines = [
        f'[package]\nname = "{name}"\npublisher = "bench"\n',
        '[tasks.t]\ncommand = ["true"]\n',
    ]
    keys = []
    for i in range(steps):
        needs = f', needs = ["s{i - 1}"]' if chain and i else ""
        keys.append(f'{{ key = "s{i}", task = "t"{needs} }}')
    lines.append(f"[workflows.w]\nsteps = [{', '.join(keys)}]\n")
    return "\n".join(lines)


def measure(url: str, steps: int) -> dict[str, float]:
    parts = urlsplit(url)
    proxy = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    schema = f"bench_rt_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    figures: dict[str, float] = {}
    try:
        rt = qlflow.open(with_search_path(_via(url, proxy.port), schema), pool_max_size=1)
        try:
            store = rt.store
            for name, streams in (("append, 1 stream", 1), ("append, 3 streams", 3)):
                counts = []
                for _ in range(5):
                    appends = [
                        StreamAppend(f"run-bench{uuid.uuid4().hex[:12]}", 0, (_event(1), _event(2)))
                        for _ in range(streams)
                    ]

                    def write(appends=appends):
                        with store.transaction() as tx:
                            tx.append(appends)

                    counts.append(proxy.count(write)[0])
                figures[f"{name} (whole transaction)"] = min(counts)
            folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"{schema}-pkg"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "qlflow.toml").write_text(_manifest(steps))
            rt.publish(str(folder), now_ms=T0)
            (folder / "qlflow.toml").write_text(_manifest(steps, chain=True))
            rt.publish(str(folder), now_ms=T0)
            figures["start (admission)"], receipt = proxy.count(
                lambda: rt.start("rt", "w", admission_key="bench", now_ms=T0)
            )
            figures["cycle claiming the steps"], _ = proxy.count(lambda: rt.cycle(now_ms=T0))
            leases = []
            lease_counts, start_counts, complete_counts = [], [], []
            for _ in range(steps):
                n, got = proxy.count(lambda: rt.lease_attempts("w1", limit=1, now_ms=T0 + 1))
                lease_counts.append(n)
                leases += got
            for lease in leases:
                n, running = proxy.count(lambda lease=lease: rt.mark_running(lease, now_ms=T0 + 2))
                start_counts.append(n)
                n, _ = proxy.count(
                    lambda running=running: rt.complete(running, "succeeded", now_ms=T0 + 3)
                )
                complete_counts.append(n)
            figures["lease_attempts (per step)"] = sum(lease_counts) / steps
            figures["mark_running (per step)"] = sum(start_counts) / steps
            figures["complete (per step)"] = sum(complete_counts) / steps
            figures["final cycle"], _ = proxy.count(lambda: rt.cycle(now_ms=T0 + 4))
            assert rt.get_run(receipt.run_id).status == "succeeded"
            figures.update(_loop_calls(rt, proxy, steps))
            figures.update(_per_workflow(rt, proxy))
        finally:
            rt.close()
    finally:
        proxy.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return figures


def _loop_calls(rt, proxy: CountingProxy, steps: int) -> dict[str, float]:
    """The calls of the README's loop on the store's own clock (no now_ms): a start,
    `lease_attempts(start=True)`, `renew`, `complete`; then `cancel` of a pending Run
    (its roots claimed) and of one with a leased step."""
    figures: dict[str, float] = {}
    n, receipt = proxy.count(lambda: rt.start("rt", "w"))
    figures["start (store clock)"] = n
    n, leases = proxy.count(lambda: rt.lease_attempts("w2", limit=steps, start=True))
    figures["lease_attempts start=True (per call)"] = n
    renews, completes = [], []
    for lease in leases:
        n, lease = proxy.count(lambda lease=lease: rt.renew(lease))
        renews.append(n)
        n, _ = proxy.count(lambda lease=lease: rt.complete(lease, "succeeded"))
        completes.append(n)
    figures["renew (per step)"] = sum(renews) / len(renews)
    figures["complete, store clock (per step)"] = sum(completes) / len(completes)
    assert rt.get_run(receipt.run_id).status == "succeeded"
    # a worker pool's call: the completion takes the next step in its own commit —
    # another claimed step of the Run (rt), or the one it made ready (rtc, a chain)
    for package, worker, name in (
        ("rt", "w4", "complete_and_lease, one next step (per step)"),
        ("rtc", "w6", "complete_and_lease, the step it made ready (per step)"),
    ):
        nexts = _complete_and_lease_all(rt, proxy, package, worker)
        if nexts:
            figures[name] = sum(nexts) / len(nexts)
    pending = rt.start("rt", "w").run_id
    figures["cancel (pending Run)"], _ = proxy.count(lambda: rt.cancel(pending))
    held = rt.start("rt", "w").run_id
    rt.lease_attempts("w3", limit=1)
    figures["cancel (a step leased)"], _ = proxy.count(lambda: rt.cancel(held))
    return figures


def _complete_and_lease_all(rt, proxy: CountingProxy, package: str, worker: str) -> list[int]:
    """Start a Run of `package` and finish it by `complete_and_lease` alone: the round
    trips of each call that handed out a next lease."""
    run_id = rt.start(package, "w").run_id
    (lease,) = rt.lease_attempts(worker, limit=1, start=True)
    nexts = []
    while lease is not None:
        n, done = proxy.count(lambda lease=lease: rt.complete_and_lease(lease, "succeeded"))
        lease = done.next_leases[0] if done.next_leases else None
        if lease is not None:
            nexts.append(n)
    assert rt.get_run(run_id).status == "succeeded"
    return nexts


def _per_workflow(rt, proxy: CountingProxy, workflows: int = 10) -> dict[str, float]:
    """Round trips and bytes on the wire per Workflow of bench.peers' 8-step DAG, run
    by the README's per-call loop: the starts, then `lease_attempts(start=True)` of
    whatever is claimable and one `complete` per Attempt until every Run ended."""
    rt.publish(peers._manifest())
    trips0, bytes0 = proxy.totals()
    run_ids = [rt.start(peers.PACKAGE, peers.WORKFLOW).run_id for _ in range(workflows)]
    while leases := rt.lease_attempts("w5", limit=peers.PER_CALL_LIMIT, start=True):
        for lease in leases:
            rt.complete(lease, "succeeded")
    trips, sent = proxy.totals()
    assert all(rt.get_run(r).status == "succeeded" for r in run_ids)
    return {
        "per-call loop, 8-step DAG (per Workflow)": (trips - trips0) / workflows,
        "per-call loop, kB on the wire (per Workflow)": round(
            (sent - bytes0) / workflows / 1000, 1
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--label", default="current")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="one step: does it still run")
    args = parser.parse_args()
    if args.smoke:
        args.steps = 1
    if not args.pg:
        raise SystemExit("give --pg URL or set QLFLOW_TEST_PG_URL")
    figures = measure(args.pg, args.steps)
    table = Table(title=f"PostgreSQL round trips per call ({args.label})")
    table.add_column("call")
    table.add_column("round trips", justify="right")
    for name, value in figures.items():
        table.add_row(name, f"{value:g}")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"roundtrips-{args.label}.json"
    out.write_bytes(
        orjson.dumps(
            {"label": args.label, "steps": args.steps, "round_trips": figures},
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
