"""Plan v2 in the dashboard on both stores: a Run's parameters, each step's output,
attempts and retry state; the start form with a Workflow's parameters."""

from __future__ import annotations

import re

from tests.ui.conftest import csrf_of
from tests.ui.support import HOSTILE, T0

ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
LONG = "x" * 300


def manifest(max_attempts: int = 3, backoff_ms: int = 60_000) -> dict:
    return {
        "package": {"name": "daily", "publisher": "acme"},
        "tasks": {"fetch": {"command": ["true"]}, "load": {"command": ["true"]}},
        "workflows": {
            "nightly": {
                "params": {
                    "date": {"type": "string", "description": "the <i>day</i>"},
                    "limit": {"type": "integer", "default": 10},
                    "dry": {"type": "boolean", "default": False},
                },
                "steps": [
                    {"key": "fetch", "task": "fetch"},
                    {
                        "key": "load",
                        "task": "load",
                        "needs": ["fetch"],
                        "retry": {"max_attempts": max_attempts, "backoff_ms": backoff_ms},
                    },
                ],
            }
        },
    }


def finish(rt, now_ms: int, outcome: str, output=None) -> None:
    (lease,) = rt.lease_attempts("w1", ttl_ms=30_000, now_ms=now_ms)
    lease = rt.mark_running(lease, now_ms=now_ms)
    rt.complete(lease, outcome, output=output, now_ms=now_ms)


def waiting_run(rt) -> str:
    """fetch succeeded with a hostile, long output; load failed once, its retry waits."""
    rt.publish(manifest(), now_ms=T0)
    run_id = rt.start("daily", "nightly", params={"date": HOSTILE}, now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    finish(rt, T0, "succeeded", {"a_note": HOSTILE, "long": LONG})
    rt.cycle(now_ms=T0 + 1)
    finish(rt, T0 + 2, "failed")
    step = rt.get_run(run_id).steps["load"]
    assert (step.status, step.retry_at_ms) == ("ready", T0 + 60_002)
    return run_id


def test_run_page_shows_params_outputs_and_the_waiting_retry(rt, client):
    run_id = waiting_run(rt)
    for path in (f"/runs/{run_id}", f"/runs/{run_id}/live"):
        html = client.get(path).text
        assert "<script>alert(1)" not in html
        params = html[html.index('class="run-params"') :]
        assert f'<tr data-param="date"><td><code>date</code></td><td class="value">{ESCAPED}' in (
            params
        )
        assert '<td class="value">false</td>' in params and '<td class="value">10</td>' in params
        fetch = html[html.index('<tr data-step="fetch"') :]
        fetch = fetch[: fetch.index("</tr>")]
        assert ESCAPED.replace("&", "&amp;") not in fetch  # escaped once, not twice
        assert "&lt;script&gt;" in fetch and LONG not in fetch  # clipped
        assert f'href="/runs/{run_id}/steps/fetch#output">full</a>' in fetch
        node = re.search(r'<a class="node st-(\w+)"[^>]*data-step="load"[^>]*>', html)
        assert node and node.group(1) == "retry"
        assert 'data-retry="retry 2 of 3 at ' in node.group(0)
        assert re.search(r'<a class="node st-succeeded"[^>]*data-step="fetch"', html)
        load = html[html.index('<tr data-step="load"') :]
        load = load[: load.index("</tr>")]
        assert '<td class="num">1 of 3</td>' in load
        assert "retry 2 of 3 at " in load


def test_step_page_shows_the_full_output_and_the_retry_state(rt, client):
    run_id = waiting_run(rt)
    fetch = client.get(f"/runs/{run_id}/steps/fetch").text
    assert "<script>alert(1)" not in fetch
    full = fetch[fetch.index('<pre class="output">') :]
    assert LONG in full and ESCAPED in full
    load = client.get(f"/runs/{run_id}/steps/load").text
    assert "Attempts: 1 of at most 3, 1 failed" in load
    assert '<span class="retry">retry 2 of 3 at ' in load
    assert "No output yet" in load


def test_a_retried_step_that_succeeds_is_no_longer_waiting(rt, client, clock):
    run_id = waiting_run(rt)
    rt.cycle(now_ms=T0 + 60_002)
    finish(rt, T0 + 60_002, "succeeded", {"loaded": 7})
    clock.now_ms = T0 + 70_000
    html = client.get(f"/runs/{run_id}").text
    assert "st-retry" not in html and "retry 2 of 3" not in html
    load = html[html.index('<tr data-step="load"') :]
    load = load[: load.index("</tr>")]
    assert "after 1 failed" in load and "<code>{&#34;loaded&#34;:7}</code>" in load


def test_start_form_offers_the_declared_params_with_defaults(rt, client):
    rt.publish(manifest(), now_ms=T0)
    packages = client.get("/packages").text
    assert 'href="/start?package=daily&amp;workflow=nightly"' in packages
    response = client.get("/start", params={"package": "daily", "workflow": "nightly"})
    assert response.status_code == 200
    html = response.text
    assert 'name="param.date" value=""' in html
    assert 'name="param.limit" value="10" inputmode="numeric"' in html
    assert '<option value="false" selected>false</option>' in html
    assert "the &lt;i&gt;day&lt;/i&gt;" in html  # a description is user data too
    missing = client.get("/start", params={"package": "daily", "workflow": "nope"})
    assert missing.status_code == 404


def test_start_with_params_binds_them(rt, client, clock):
    rt.publish(manifest(), now_ms=T0)
    token = csrf_of(client.get("/start?package=daily&workflow=nightly").text)
    form = {"csrf": token, "package": "daily", "workflow": "nightly"}
    form.update({"param.date": HOSTILE, "param.limit": "25", "param.dry": "true"})
    response = client.post("/start", data=form)
    assert response.status_code == 303
    run_id = response.headers["location"].removeprefix("/runs/").split("?")[0]
    assert rt.get_run(run_id).params == {"date": HOSTILE, "limit": 25, "dry": True}
    html = client.get(f"/runs/{run_id}").text
    assert ESCAPED in html and "<script>alert(1)" not in html


def test_start_with_bad_params_is_refused_on_the_form_and_starts_nothing(rt, client):
    rt.publish(manifest(), now_ms=T0)
    token = csrf_of(client.get("/start?package=daily&workflow=nightly").text)
    base = {"csrf": token, "package": "daily", "workflow": "nightly"}
    events = len(rt.events())
    for fields, name, words in (
        ({"param.date": "d", "param.limit": "ten"}, "limit", "is an integer"),
        ({"param.limit": "3"}, "date", "is required"),
        ({"param.date": "d", "param.dry": "maybe"}, "dry", "true or false"),
        ({"param.date": HOSTILE, "param.nope": "1"}, "nope", "unknown parameter"),
    ):
        response = client.post("/start", data={**base, **fields})
        assert response.status_code == 400, fields
        html = response.text
        assert f'class="form-error" role="alert" data-error-field="{name}"' in html
        assert words in html
        assert "<script>alert(1)" not in html
        for key, value in fields.items():  # what was typed is kept in the fields
            if key != "param.nope" and key != "param.dry":
                assert (
                    f'name="{key}" value="{value.replace("<", "&lt;").replace(">", "&gt;")}"'
                    in (html)
                )
    assert len(rt.events()) == events and rt.runs() == []


def test_start_with_bad_params_without_csrf_is_refused_first(rt, client):
    rt.publish(manifest(), now_ms=T0)
    client.get("/packages")
    response = client.post(
        "/start", data={"package": "daily", "workflow": "nightly", "param.limit": "x"}
    )
    assert response.status_code == 403
    assert rt.runs() == []
