"""The schedules page on both stores: each schedule's Workflow, cron in words, zone,
next and last fire, paused; pause and resume as CSRF-checked POSTs."""

from __future__ import annotations

from starlette.testclient import TestClient

from qlflow.ui import create_app
from tests.schedules.helpers import manifest, ms, schedule
from tests.ui.conftest import csrf_of

NOW = ms("2026-12-01T03:30:00Z")
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def armed(rt) -> str:
    """A published, armed daily schedule; its id."""
    rt.publish(manifest(schedule("0 3 * * *", "Europe/Berlin")), now_ms=NOW - 3_600_000)
    rt.cycle(now_ms=NOW - 3_600_000)
    (view,) = rt.schedules()
    assert view.next_fire_at_ms is not None
    return view.schedule_id


def test_schedules_page_lists_each_schedule(rt, client, clock):
    schedule_id = armed(rt)
    clock.now_ms = NOW
    response = client.get("/schedules")
    assert response.status_code == 200
    html = response.text
    row = html[html.index(f'<tr data-schedule="{schedule_id}" data-status="active">') :]
    row = row[: row.index("</tr>")]
    (view,) = rt.schedules()
    assert f"{view.description}<br><code>0 3 * * *</code>" in row
    assert "<td>Europe/Berlin</td>" in row
    assert "<td>allow</td>" in row  # its overlap policy
    assert f'data-ms="{view.next_fire_at_ms}"' in row  # local time, with a hint
    assert " CET</span>" in row  # and in the schedule's zone
    assert f'action="/schedules/{schedule_id}/pause"' in row and 'data-action="pause"' in row
    assert '<a href="/schedules" aria-current="page">Schedules</a>' in html


def test_no_schedules_says_how_to_declare_one(client):
    assert "No schedules: declare" in client.get("/schedules").text


def test_pause_and_resume_are_posts_with_csrf(rt, client, clock):
    schedule_id = armed(rt)
    clock.now_ms = NOW
    token = csrf_of(client.get("/schedules").text)
    paused = client.post(f"/schedules/{schedule_id}/pause", data={"csrf": token})
    assert (paused.status_code, paused.headers["location"]) == (
        303,
        "/schedules?notice=schedule-paused",
    )
    (view,) = rt.schedules()
    assert view.paused and view.next_fire_at_ms is None
    html = client.get("/schedules?notice=schedule-paused").text
    assert "Schedule paused" in html and 'data-action="resume"' in html
    again = client.post(f"/schedules/{schedule_id}/pause", data={"csrf": token})
    assert again.headers["location"] == "/schedules?notice=schedule-unchanged"
    resumed = client.post(f"/schedules/{schedule_id}/resume", data={"csrf": token})
    assert resumed.headers["location"] == "/schedules?notice=schedule-resumed"
    (view,) = rt.schedules()
    assert not view.paused and view.next_fire_at_ms is not None


def test_pause_without_csrf_or_from_another_site_is_refused(rt, client):
    schedule_id = armed(rt)
    token = csrf_of(client.get("/schedules").text)
    events = len(rt.events())
    for data, headers in (
        ({}, {}),
        ({"csrf": "x" * 32}, {}),
        ({"csrf": token}, {"origin": "http://evil.example"}),
    ):
        response = client.post(f"/schedules/{schedule_id}/pause", data=data, headers=headers)
        assert response.status_code == 403, (data, headers)
        assert "CSRF check failed" in response.text
    assert len(rt.events()) == events and not rt.schedules()[0].paused
    assert client.get(f"/schedules/{schedule_id}/pause").status_code == 405


def test_pause_and_resume_need_the_token_off_loopback(rt, clock):
    schedule_id = armed(rt)
    app = create_app(rt, token="t" * 32, allow_remote=True, clock=clock)
    with TestClient(app, base_url="http://10.0.0.5", follow_redirects=False) as remote:
        assert remote.get("/schedules").status_code == 401
        refused = remote.post(f"/schedules/{schedule_id}/pause", data={"csrf": "x"})
        assert refused.status_code == 401
        wrong = remote.post(f"/schedules/{schedule_id}/pause", headers={"x-qlflow-token": "w" * 32})
        assert wrong.status_code == 403
        assert not rt.schedules()[0].paused
        remote.headers["authorization"] = "Bearer " + "t" * 32
        token = csrf_of(remote.get("/schedules").text)
        done = remote.post(f"/schedules/{schedule_id}/pause", data={"csrf": token})
        assert done.status_code == 303 and rt.schedules()[0].paused


def test_an_unknown_schedule_is_a_404_and_writes_nothing(rt, client):
    armed(rt)
    token = csrf_of(client.get("/schedules").text)
    events = len(rt.events())
    for action in ("pause", "resume"):
        response = client.post(f"/schedules/sch:{'0' * 32}/{action}", data={"csrf": token})
        assert response.status_code == 404
        assert "no schedule" in response.text
    assert len(rt.events()) == events


def test_a_schedule_param_value_is_escaped(rt, client):
    rt.publish(
        manifest(
            schedule("*/5 * * * *", params={"note": "<script>alert(1)</script>"}),
            params={"note": {"type": "string"}},
        ),
        now_ms=NOW,
    )
    rt.cycle(now_ms=NOW)
    rt.cycle(now_ms=NOW + 300_000)
    (run,) = rt.runs()
    html = client.get(f"/runs/{run.run_id}").text
    assert ESCAPED in html and "<script>alert(1)" not in html
    schedules = client.get("/schedules").text
    assert f'href="/runs/{run.run_id}"' in schedules  # the last fire's Run


def test_an_unarmed_schedule_has_no_button_and_its_pause_is_refused(rt, client):
    rt.publish(manifest(schedule("0 3 * * *")), now_ms=NOW)  # no cycle armed it yet
    (view,) = rt.schedules()
    html = client.get("/schedules").text
    assert 'title="armed by the next cycle">unarmed' in html
    assert "at the next cycle's arming" in html and 'data-action="pause"' not in html
    token = csrf_of(client.get("/packages").text)  # no form on the page: another one's
    response = client.post(f"/schedules/{view.schedule_id}/pause", data={"csrf": token})
    assert response.status_code == 400 and "not armed yet" in response.text
    assert not rt.schedules()[0].paused
