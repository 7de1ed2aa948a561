"""`qlflow serve --metrics-port 0 --log-format json`: /metrics after a diamond Run
equals what the log says, and every stderr line is a JSON object carrying its ids."""

from __future__ import annotations

import signal
import urllib.request
from collections import Counter
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.cli.helpers import Spawned, copy_example, qlflow_json, sqlite_url, wait_for


def json_lines(text: str) -> list[dict]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def samples(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_serve_serves_metrics_and_logs_json(tmp_path: Path):
    package = copy_example("diamond", tmp_path)
    db = sqlite_url(tmp_path)
    qlflow_json("publish", str(package), db=db, cwd=tmp_path)
    receipt = qlflow_json("start", "diamond", "diamond", db=db, cwd=tmp_path)
    run_id = receipt["run_id"]
    serve = Spawned(
        "serve", "--package-dir", str(package), "--interval-ms", "100",
        "--metrics-port", "0", "--log-format", "json", db=db, cwd=tmp_path,
    )  # fmt: skip
    try:
        started = wait_for(
            lambda: [e for e in json_lines(serve.stderr) if e.get("event") == "metrics"],
            30,
            "the metrics server",
        )
        url = f"http://127.0.0.1:{started[0]['port']}/metrics"
        wait_for(
            lambda: any(
                e.get("event") == "run_ended" and e.get("run_id") == run_id
                for e in json_lines(serve.stderr)
            ),
            60,
            "the Run's end",
        )
        found = samples(url)
        serve.process.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0, serve.stderr
    finally:
        serve.kill()

    events = qlflow_json("events", "--all", db=db, cwd=tmp_path)  # one Run in this store
    types = Counter(event["type"] for event in events)
    # the diamond: a and b succeed, c fails (exit 1), d is skipped, the Run fails
    for step, outcome in (("a", "succeeded"), ("b", "succeeded"), ("c", "failed"),
                          ("d", "skipped")):  # fmt: skip
        key = ("qlflow_steps_finished_total", (("outcome", outcome), ("task", f"diamond@1#{step}")))
        assert found[key] == 1, (step, outcome)
    assert found[("qlflow_leases_granted_total", ())] == types["lease.granted"] == 3
    assert found[("qlflow_runs_finished_total", (("status", "failed"),))] == 1
    assert found[("qlflow_runs", (("status", "failed"),))] == 1
    assert found[("qlflow_host_slots", ())] == 4
    assert found[("qlflow_host_slots_in_use", ())] == 0

    lines = json_lines(serve.stderr)  # every line parses
    leases = [e for e in lines if e.get("event") == "lease"]
    assert sorted(e["step_key"] for e in leases) == ["a", "b", "c"]
    assert all(e["run_id"] == run_id and e["attempt_id"] and e["lease_id"] for e in leases)
    completions = {e["step_key"]: e for e in lines if e.get("event") == "completion"}
    assert {k: e["outcome"] for k, e in completions.items()} == {
        "a": "succeeded", "b": "succeeded", "c": "failed",
    }  # fmt: skip
    assert completions["c"]["result_code"] and completions["c"]["run_id"] == run_id
    [drain] = [e for e in lines if e.get("event") == "drain"]
    assert (drain["running"], drain["stopped"]) == (0, 0)
    [draining] = [e for e in lines if e.get("event") == "drain_started"]
    assert draining["signal"] == "SIGTERM"
    # the host's own events name it: the worker id its leases were granted to
    assert {e["worker_id"] for e in leases} == {drain["worker_id"]} == {draining["worker_id"]}
    assert all({"ts_ms", "level", "logger", "msg"} <= e.keys() for e in lines)
