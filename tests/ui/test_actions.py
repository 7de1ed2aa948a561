"""Cancel and start: POSTs with a CSRF token; refused without one, writing nothing."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from qlflow.ui import create_app, security
from tests.ui.conftest import LOOPBACK, csrf_of
from tests.ui.support import T0, manifest, scenario, work


@pytest.fixture
def ids(rt):
    return scenario(rt)


def test_cancel_records_intent_and_the_run_converges(rt, client, clock, ids):
    run_id = ids["running"]
    token = csrf_of(client.get(f"/runs/{run_id}").text)
    clock.now_ms = T0 + 10_000
    response = client.post(f"/runs/{run_id}/cancel", data={"csrf": token})
    assert response.status_code == 303
    assert response.headers["location"] == f"/runs/{run_id}?notice=cancel-requested"
    run = rt.get_run(run_id)
    assert (run.cancel_reason, run.cancel_requested_at_ms) == ("user", T0 + 10_000)
    page = client.get(response.headers["location"]).text
    assert "Cancel requested" in page and "disabled" in page  # the button is spent
    again = client.post(f"/runs/{run_id}/cancel", data={"csrf": token})
    assert again.headers["location"].endswith("notice=cancel-existing")
    # the worker holding step a finishes; the cycle ends the Run as cancelled
    rt.cycle(now_ms=T0 + 10_001)
    (held,) = [a for s in rt.get_run(run_id).steps.values() for a in s.attempts]
    assert held.status == "running"
    lease = rt.renew(ids["lease"], ttl_ms=600_000, now_ms=T0 + 10_002)
    assert lease.stop_requested
    rt.complete(lease, "succeeded", now_ms=T0 + 10_003)
    rt.cycle(now_ms=T0 + 10_004)
    html = client.get(f"/runs/{run_id}").text
    assert rt.get_run(run_id).status == "cancelled"
    assert 'data-live="0"' in html and "Root cause" in html


@pytest.mark.parametrize("case", ["no field", "wrong field", "no cookie", "other origin"])
def test_cancel_without_a_matching_csrf_token_is_refused(rt, client, ids, case):
    run_id = ids["running"]
    token = csrf_of(client.get(f"/runs/{run_id}").text)
    data, headers, sender = {"csrf": token}, {}, client
    if case == "no field":
        data = {}
    elif case == "wrong field":
        data = {"csrf": token[::-1]}
    elif case == "other origin":
        headers = {"origin": "http://evil.example"}
    else:  # a page elsewhere posts the right-looking field without this browser's cookie
        sender = TestClient(client.app, base_url=LOOPBACK, follow_redirects=False)
    response = sender.post(f"/runs/{run_id}/cancel", data=data, headers=headers)
    assert response.status_code == 403
    assert "CSRF" in response.text
    assert rt.get_run(run_id).cancel_requested_at_ms is None


def test_cancel_of_an_unknown_run_is_a_404(rt, client, ids):
    token = csrf_of(client.get(f"/runs/{ids['running']}").text)
    response = client.post("/runs/run:missing/cancel", data={"csrf": token})
    assert response.status_code == 404


def test_an_action_route_takes_post_only(client, ids):
    assert client.get(f"/runs/{ids['running']}/cancel").status_code == 405


def test_start_admits_a_run_at_the_clock(rt, client, clock, ids):
    token = csrf_of(client.get("/packages").text)
    clock.now_ms = T0 + 20_000
    response = client.post("/start", data={"csrf": token, "package": "demo", "workflow": "flow"})
    assert response.status_code == 303
    location = response.headers["location"]
    assert location.endswith("?notice=started")
    run_id = location.removeprefix("/runs/").split("?")[0]
    run = rt.get_run(run_id)
    assert (run.status, run.admitted_at_ms, run.workflow_key) == ("running", T0 + 20_000, "flow")
    assert run_id in client.get("/runs").text
    rt.cycle(now_ms=T0 + 20_001)
    assert work(rt, T0 + 20_001) == 1  # step a was claimed and ran


def test_start_refused_by_the_start_guard_writes_nothing(rt, client, ids):
    head = rt.publish(manifest([("a", [])]), now_ms=T0 + 5000)
    rt.withdraw(head.publication_id, now_ms=T0 + 5001)
    before = len(rt.runs())
    token = csrf_of(client.get("/packages").text)
    response = client.post("/start", data={"csrf": token, "package": "demo", "workflow": "flow"})
    assert response.status_code == 409
    assert "withdrawn" in response.text
    unknown = client.post("/start", data={"csrf": token, "package": "nope", "workflow": "x"})
    assert unknown.status_code == 404
    assert len(rt.runs()) == before


def test_start_without_csrf_is_refused(rt, client, ids):
    client.get("/packages")
    before = len(rt.runs())
    response = client.post("/start", data={"package": "demo", "workflow": "flow"})
    assert response.status_code == 403
    assert len(rt.runs()) == before


@pytest.mark.parametrize(
    "case", ["origin null, a cookie never issued", "a cookie never issued", "origin null"]
)
def test_start_with_a_csrf_token_the_server_never_issued_or_from_origin_null_is_refused(
    rt, ids, case
):
    before = len(rt.runs())
    app = create_app(rt, token=None, allow_remote=False, clock=lambda: T0)
    with TestClient(app, base_url=LOOPBACK, follow_redirects=False) as sender:
        if case == "origin null":  # a real token of this server, posted by an opaque origin
            token = csrf_of(sender.get("/packages").text)
        else:  # the attack: any 40 characters, in the cookie and the field alike
            token = "A" * 40
            sender.cookies.set(security.CSRF_COOKIE, token)
        headers = {"origin": "null"} if "null" in case else {}
        response = sender.post(
            "/start",
            data={"csrf": token, "package": "demo", "workflow": "flow"},
            headers=headers,
        )
    assert response.status_code == 403
    assert "CSRF" in response.text or "origin" in response.text
    assert len(rt.runs()) == before


def test_a_token_of_this_server_still_starts_a_run_from_the_same_origin(rt, client, ids):
    token = csrf_of(client.get("/packages").text)
    assert security.issued_csrf_token(token)
    response = client.post(
        "/start",
        data={"csrf": token, "package": "demo", "workflow": "flow"},
        headers={"origin": LOOPBACK},
    )
    assert response.status_code == 303


def test_rerun_from_the_run_page_reuses_what_succeeded_and_shows_the_lineage(rt, client, ids):
    source = ids["failed"]  # b failed, d skipped
    page = client.get(f"/runs/{source}").text
    assert 'data-action="rerun"' in page
    assert 'data-action="rerun"' not in client.get(f"/runs/{ids['succeeded']}").text
    assert 'data-action="rerun"' not in client.get(f"/runs/{ids['running']}").text
    token = csrf_of(page)
    response = client.post(f"/runs/{source}/rerun", data={"csrf": token})
    assert response.status_code == 303
    rerun_id = response.headers["location"].split("/runs/")[1].split("?")[0]
    assert response.headers["location"].endswith("notice=rerun-started")
    rerun = rt.get_run(rerun_id)
    assert rerun.rerun_of == source
    assert sorted(k for k, s in rerun.steps.items() if s.reused_from) == ["a", "c"]
    again = client.post(f"/runs/{source}/rerun", data={"csrf": token})  # a second click
    assert again.headers["location"] == f"/runs/{rerun_id}?notice=rerun-existing"
    assert [r.run_id for r in rt.runs(rerun_of=source)] == [rerun_id]
    html = client.get(f"/runs/{rerun_id}").text
    assert 'data-lineage="rerun-of"' in html and source[:8] in html
    assert f'href="/runs/{rerun_id}" data-lineage="rerun-as"' in client.get(f"/runs/{source}").text
    step = client.get(f"/runs/{rerun_id}/steps/a").text
    assert 'data-lineage="reused-from"' in step


def test_rerun_from_a_failed_step_and_without_a_token(rt, client, ids):
    source = ids["failed"]
    step_page = client.get(f"/runs/{source}/steps/b").text
    assert 'data-action="rerun-from"' in step_page
    assert 'data-action="rerun-from"' not in client.get(f"/runs/{source}/steps/a").text
    refused = client.post(f"/runs/{source}/rerun", data={"from": "b"})
    assert refused.status_code == 403 and rt.runs(rerun_of=source) == []
    token = csrf_of(step_page)
    response = client.post(f"/runs/{source}/rerun", data={"csrf": token, "from": "a"})
    rerun_id = response.headers["location"].split("/runs/")[1].split("?")[0]
    assert not any(s.reused_from for s in rt.get_run(rerun_id).steps.values())
