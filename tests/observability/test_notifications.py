"""Failure notifications: the manifest's notify rules, the outbox written in the
Run's terminal commit, and delivery (signed webhook, retry with backoff, at least
once after the host dies), on both stores."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import Iterator

import pytest

import qlflow
from domain import streams
from domain.errors import ManifestError
from domain.event_types import EventType, Family, of
from domain.notify import (
    BACKOFF_BASE_MS,
    MAX_DELIVERY_ATTEMPTS,
    fold_deliveries,
    notify_document,
    parse_notify,
)
from qlflow.notifications import SIGNATURE_HEADER, deliver_due, deliveries
from tests.cycle.helpers import DIAMOND, T0, drive, manifest

SECRET = "s3cret-for-tests"


class Hook:
    """A local webhook receiver: answers each POST with the next planned status."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.received: list[tuple[bytes, dict[str, str]]] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append((body, dict(self.headers)))
                status = hook.statuses.pop(0) if hook.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    receiver = Hook([])
    yield receiver
    receiver.close()


def notifying(url: str, on: list[str] | None = None) -> dict:
    document = manifest(DIAMOND)
    document["workflows"]["flow"]["notify"] = [
        {"on": on or ["failed", "timed_out"], "webhook": url, "secret_env": "HOOK_SECRET"}
    ]
    return document


def failed_run(rt, url: str) -> str:
    rt.publish(notifying(url), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    drive(rt, T0, outcomes={"c": "failed"})
    assert rt.get_run(run_id).status == "failed"
    return run_id


def check_signature(body: bytes, headers: dict[str, str], at_ms: int | None = None) -> None:
    """The header is `t=<unix s>,v1=<HMAC-SHA256 of "<t>." + body>` (and t is the
    attempt's time when `at_ms` is given)."""
    stamp, mac = headers[SIGNATURE_HEADER].split(",")
    timestamp = stamp.removeprefix("t=")
    if at_ms is not None:
        assert timestamp == str(at_ms // 1000)
    expected = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    assert mac == f"v1={expected.hexdigest()}"
    forged = hmac.new(b"another secret", f"{timestamp}.".encode() + body, hashlib.sha256)
    assert mac != f"v1={forged.hexdigest()}"


def test_the_due_record_is_written_in_the_terminal_commit(store_url, hook):
    with qlflow.open(store_url) as rt:
        run_id = failed_run(rt, hook.url)
        outbox = rt.store.read_stream(streams.notification_stream(run_id))
        run = rt.store.read_stream(streams.run_stream(run_id))
        terminal = [r for r in run if r.type == of(Family.WORKFLOW, "failed")]
        assert [r.type for r in outbox] == [EventType.NOTIFICATION_DUE]
        due = outbox[0]
        assert due.data["status"] == "failed" and due.data["run_id"] == run_id
        assert due.data["target"] == {
            "on": ["failed", "timed_out"], "webhook": hook.url, "secret_env": "HOOK_SECRET"
        }  # fmt: skip
        # one commit: the same transaction's records are contiguous in the log
        assert due.metadata["causation_id"] == terminal[0].metadata["causation_id"]
        between = rt.store.read_all(terminal[0].global_position, limit=10)
        assert due.global_position in [r.global_position for r in between]
        [pending] = deliveries(rt.store)
        assert pending.state == "pending" and pending.attempts == 0


def test_a_rule_not_matching_writes_nothing(store_url, hook):
    with qlflow.open(store_url) as rt:
        document = notifying(hook.url, on=["timed_out"])
        rt.publish(document, now_ms=T0)
        run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
        drive(rt, T0, outcomes={"c": "failed"})
        assert rt.store.read_stream(streams.notification_stream(run_id)) == []
        assert deliveries(rt.store) == []


def test_signed_webhook_retried_after_a_500_then_delivered(store_url, hook):
    hook.statuses = [500]
    env = {"HOOK_SECRET": SECRET}
    with qlflow.open(store_url) as rt:
        run_id = failed_run(rt, hook.url)
        now = T0 + 1_000
        [first] = deliver_due(rt.store, now, env=env)
        assert (first.delivered, first.attempt, first.error) == (False, 1, "HTTP 500")
        [pending] = deliveries(rt.store)
        assert pending.retry_at_ms == now + BACKOFF_BASE_MS and pending.last_error == "HTTP 500"
        assert deliver_due(rt.store, now + BACKOFF_BASE_MS - 1, env=env) == []  # backoff
        [second] = deliver_due(rt.store, now + BACKOFF_BASE_MS, env=env)
        assert second.delivered and second.attempt == 2
        assert deliver_due(rt.store, now + 10**9, env=env) == []  # delivered: never again
        [done] = deliveries(rt.store)
        assert done.state == "delivered" and done.attempts == 2
    assert len(hook.received) == 2
    for (body, headers), at_ms in zip(hook.received, (now, now + BACKOFF_BASE_MS), strict=True):
        check_signature(body, headers, at_ms)
        assert json.loads(body)["run_id"] == run_id and json.loads(body)["status"] == "failed"
    attempts = [json.loads(body)["attempt"] for body, _ in hook.received]
    assert attempts == [1, 2]


def test_gives_up_after_the_last_attempt(store_url, hook):
    hook.statuses = [503] * MAX_DELIVERY_ATTEMPTS
    with qlflow.open(store_url) as rt:
        failed_run(rt, hook.url)
        now = T0
        for _ in range(MAX_DELIVERY_ATTEMPTS):
            now = max(now, deliveries(rt.store)[0].retry_at_ms)
            [result] = deliver_due(rt.store, now, env={"HOOK_SECRET": SECRET})
            assert not result.delivered
        [failed] = deliveries(rt.store)
        assert failed.state == "failed" and failed.attempts == MAX_DELIVERY_ATTEMPTS
        assert deliver_due(rt.store, now + 10**9, env={"HOOK_SECRET": SECRET}) == []


def test_a_missing_secret_is_a_failed_attempt_not_an_unsigned_post(store_url, hook):
    with qlflow.open(store_url) as rt:
        failed_run(rt, hook.url)
        due_at = deliveries(rt.store)[0].due_at_ms
        [result] = deliver_due(rt.store, due_at, env={})
        assert not result.delivered and "HOOK_SECRET" in (result.error or "")
    assert hook.received == []


def test_command_target_gets_the_body_on_stdin(store_url, tmp_path):
    out = tmp_path / "got.json"
    document = manifest(DIAMOND)
    document["workflows"]["flow"]["notify"] = [
        {
            "on": ["failed"],
            "command": [
                "sh",
                "-c",
                f'cat > {out}; echo >> {out}; echo "$QLFLOW_RUN_STATUS" >> {out}',
            ],
        }
    ]
    with qlflow.open(store_url) as rt:
        rt.publish(document, now_ms=T0)
        run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
        drive(rt, T0, outcomes={"c": "failed"})
        due_at = deliveries(rt.store)[0].due_at_ms
        [result] = deliver_due(rt.store, due_at, env={"PATH": "/usr/bin:/bin"})
        assert result.delivered, result.error
    body, status = out.read_text().splitlines()
    assert json.loads(body)["run_id"] == run_id and status == "failed"


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"on": ["failed"]}, "notify[0]"),
        ({"on": ["nope"], "webhook": "https://x"}, "notify[0].on"),
        ({"on": [], "webhook": "https://x"}, "notify[0].on"),
        ({"on": ["failed"], "webhook": "ftp://x"}, "notify[0].webhook"),
        ({"on": ["failed"], "webhook": "https://x", "command": ["a"]}, "notify[0]"),
        ({"on": ["failed"], "command": ["a"], "secret_env": "S"}, "notify[0].secret_env"),
        ({"on": ["failed"], "webhook": "https://x", "secret_env": "1 bad"}, "notify[0].secret_env"),
        ({"on": ["failed"], "command": []}, "notify[0].command"),
        ({"on": ["failed"], "webhook": "https://x", "extra": 1}, "notify[0]"),
    ],
)
def test_bad_rules_are_refused_at_publish_with_the_field(store_url, rule, field):
    document = manifest(DIAMOND)
    document["workflows"]["flow"]["notify"] = [rule]
    with qlflow.open(store_url) as rt:
        head = rt.store.head_position()
        with pytest.raises(ManifestError) as caught:
            rt.publish(document, now_ms=T0)
        assert caught.value.key == field
        assert rt.store.head_position() == head  # nothing written


def test_rules_read_back_sorted_and_canonical():
    rules = parse_notify([{"on": ["timed_out", "failed"], "webhook": "https://h/x"}])
    assert notify_document(rules) == [{"on": ["failed", "timed_out"], "webhook": "https://h/x"}]
    assert parse_notify(notify_document(rules)) == rules


_KILLED_HOST = """
import os, signal, sys
import qlflow
from tests.cycle.helpers import T0, drive
from tests.observability.test_notifications import notifying

url, hook = sys.argv[1:]
rt = qlflow.open(url)


def die_after_the_terminal_commit(commit):
    # the commit that ends the Run, whatever else it holds: a notification written
    # in a later commit would be lost here
    if any(r.type == "workflow.failed" for r in commit.records):
        os.kill(os.getpid(), signal.SIGKILL)


rt.store.observers.on_commit(die_after_the_terminal_commit)
rt.publish(notifying(hook), now_ms=T0)
rt.start("demo", "flow", admission_key="k", now_ms=T0)
drive(rt, T0, outcomes={"c": "failed"})
sys.exit(3)  # not reached: the terminal commit kills this host
"""


def test_delivered_by_the_next_host_after_a_sigkill_past_the_terminal_commit(
    store_url, hook, tmp_path
):
    """The host dies right after the commit that ends the Run (and holds the
    notification.due), before any delivery: `qlflow serve` delivers it later."""
    import subprocess
    import sys

    from tests.cli.helpers import Spawned, cli_env, qlflow_json, wait_for

    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_HOST, store_url, hook.url],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    assert hook.received == []
    [pending] = qlflow_json("notifications", db=store_url, cwd=tmp_path)
    assert (pending["state"], pending["attempts"], pending["status"]) == ("pending", 0, "failed")

    host = Spawned(
        "serve", "--interval-ms", "100", db=store_url, cwd=tmp_path,
        env={"HOOK_SECRET": SECRET},
    )  # fmt: skip
    try:
        wait_for(lambda: hook.received or None, timeout=60, what="the webhook")
        wait_for(
            lambda: qlflow_json("notifications", db=store_url, cwd=tmp_path) == [] or None,
            timeout=60,
            what="the delivery's record",
        )
    finally:
        host.process.terminate()
        host.wait()
    [(body, headers)] = hook.received
    check_signature(body, headers)
    assert json.loads(body)["run_id"] == pending["run_id"]
    [done] = qlflow_json("notifications", "--all", db=store_url, cwd=tmp_path)
    assert (done["state"], done["attempts"]) == ("delivered", 1)


def test_the_notifications_command_lists_pending_and_failed(store_url, tmp_path):
    """`qlflow notifications`: a delivery not tried yet (pending) and one that failed
    for good; the delivered one only with --all."""
    from tests.cli.helpers import qlflow as run_cli
    from tests.cli.helpers import qlflow_json

    with qlflow.open(store_url) as rt:
        rt.publish(notifying("http://127.0.0.1:9/unused"), now_ms=T0)
        runs = {name: rt.start("demo", "flow", admission_key=name, now_ms=T0).run_id
                for name in ("failed", "delivered")}  # fmt: skip
        drive(rt, T0, outcomes={"c": "failed"})

        def sender(delivery, body, now_ms, env):  # the receiver's answers, no network
            return None if delivery.run_id == runs["delivered"] else "HTTP 503"

        now = T0
        while any(d.is_pending for d in deliveries(rt.store)):
            now = max(now, min(d.retry_at_ms for d in deliveries(rt.store) if d.is_pending))
            deliver_due(rt.store, now, env={"HOOK_SECRET": SECRET}, sender=sender)
        later = now + 60_000  # this Run ends after the others' deliveries: not tried yet
        runs["pending"] = rt.start("demo", "flow", admission_key="pending", now_ms=later).run_id
        drive(rt, later, outcomes={"c": "failed"})
        states = {d.run_id: d.state for d in deliveries(rt.store)}
    assert states == {runs["pending"]: "pending", runs["failed"]: "failed",
                      runs["delivered"]: "delivered"}  # fmt: skip
    listed = qlflow_json("notifications", db=store_url, cwd=tmp_path)
    assert {(n["run_id"], n["state"]) for n in listed} == {
        (runs["pending"], "pending"), (runs["failed"], "failed"),
    }  # fmt: skip
    [failed] = [n for n in listed if n["state"] == "failed"]
    assert (failed["attempts"], failed["last_error"]) == (MAX_DELIVERY_ATTEMPTS, "HTTP 503")
    everything = qlflow_json("notifications", "--all", db=store_url, cwd=tmp_path)
    assert {n["state"] for n in everything} == {"pending", "failed", "delivered"}
    table = run_cli("notifications", db=store_url, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert runs["pending"] in table.stdout and runs["failed"] in table.stdout
    assert runs["delivered"] not in table.stdout and "HTTP 503" in table.stdout


def _folded_from_the_streams(store) -> list:
    ids = store.streams_with_prefix(streams.prefix(streams.NOTIFICATION))
    found = [d for records in store.read_streams(ids).values() for d in fold_deliveries(records)]
    return sorted(found, key=lambda d: (d.due_at_ms, d.run_id, d.rule))


def test_the_outbox_read_model_is_the_fold_of_the_streams(store_url, hook):
    hook.statuses = [500, 200]
    with qlflow.open(store_url) as rt:
        failed_run(rt, hook.url)
        deliver_due(rt.store, T0 + 1_000, env={"HOOK_SECRET": SECRET})  # 500: pending
        assert deliveries(rt.store) == _folded_from_the_streams(rt.store)
        deliver_due(rt.store, T0 + 1_000 + BACKOFF_BASE_MS, env={"HOOK_SECRET": SECRET})
        assert deliveries(rt.store) == _folded_from_the_streams(rt.store)
        assert deliveries(rt.store, delivered=False) == []  # delivered: listed only with all
        assert rt.verify_projections().ok


def test_a_delivery_call_takes_the_longest_waiting_page_only(store_url, hook, monkeypatch):
    monkeypatch.setattr("qlflow.notifications.DUE_PAGE", 2)
    with qlflow.open(store_url) as rt:
        document = notifying(hook.url)
        rt.publish(document, now_ms=T0)
        for n in range(3):
            rt.start("demo", "flow", admission_key=f"k{n}", now_ms=T0 + n)
        drive(rt, T0, outcomes={"c": "failed"})
        waiting = [d.run_id for d in sorted(deliveries(rt.store), key=lambda d: d.retry_at_ms)]
        assert len(waiting) == 3
        first = deliver_due(rt.store, T0 + 10**6, env={"HOOK_SECRET": SECRET})
        assert [r.run_id for r in first] == waiting[:2]
        second = deliver_due(rt.store, T0 + 10**6, env={"HOOK_SECRET": SECRET})
        assert [r.run_id for r in second] == waiting[2:]


def test_a_store_older_than_the_outbox_read_model_gets_it_filled(store_url, hook):
    with qlflow.open(store_url) as rt:
        failed_run(rt, hook.url)
        before = deliveries(rt.store)
        with rt.store.transaction() as tx:  # as a store made before the read model
            tx.execute("DROP TABLE notification_deliveries")
            tx.execute(
                "DELETE FROM schema_versions WHERE component = ?", ("projections.notifications",)
            )
    with qlflow.open(store_url) as rt:
        assert before and deliveries(rt.store) == before
