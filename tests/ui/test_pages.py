"""Every page over both stores: status codes and what each shows."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from qlflow.ui.times import iso
from tests.ui.support import T0, manifest, scenario


@pytest.fixture
def ids(rt):
    return scenario(rt)


def listed(html: str) -> list[str]:
    return re.findall(r'<tr data-run="([^"]+)"', html)


def test_home_redirects_to_the_runs(client):
    response = client.get("/")
    assert response.status_code == 303
    assert response.headers["location"] == "/runs"


def test_runs_page_lists_newest_first_with_short_ids(client, ids):
    response = client.get("/runs")
    assert response.status_code == 200
    assert listed(response.text) == [
        ids["cancelled"],
        ids["running"],
        ids["succeeded"],
        ids["failed"],
    ]
    failed = ids["failed"]
    # the shortest unique prefix, as `qlflow runs` shows it: 8 hex digits here
    assert f'title="{failed}">{failed[4:12]}</a>' in response.text
    assert 'data-matching="4"' in response.text
    assert "workflow_step_failed" in response.text


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"status": "failed"}, ["failed"]),
        ({"status": "running"}, ["running"]),
        ({"package": "other"}, ["cancelled"]),
        ({"package": "demo", "workflow": "flow"}, ["running", "succeeded", "failed"]),
        ({"workflow": "etl"}, ["cancelled"]),
        ({"since": str(T0 + 1000), "until": str(T0 + 3000)}, ["running", "succeeded"]),
        ({"until": str(T0 + 1)}, ["failed"]),
        ({"package": "nothing-like-it"}, []),
    ],
)
def test_runs_filters_narrow_the_list(client, ids, params, expected):
    response = client.get("/runs", params=params)
    assert response.status_code == 200
    assert listed(response.text) == [ids[name] for name in expected]
    assert f'data-matching="{len(expected)}"' in response.text


def test_runs_time_range_reads_the_browsers_zone(client, ids):
    # the datetime-local box has no zone; the page sends the browser's offset (tz)
    since = datetime.fromtimestamp((T0 + 1000) / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    both = client.get("/runs", params={"since": since, "tz": "0"})
    assert listed(both.text) == [ids["cancelled"], ids["running"], ids["succeeded"]]
    # the same wall time read one hour east of UTC is an hour earlier: all four match
    east = client.get("/runs", params={"since": since, "tz": "-60"})
    assert len(listed(east.text)) == 4


def test_runs_search_by_id_prefix(client, ids):
    run_id = ids["failed"]
    for prefix in (run_id[:10], run_id[4:10], run_id):
        response = client.get("/runs", params={"q": prefix})
        assert listed(response.text) == [run_id], prefix
    assert listed(client.get("/runs", params={"q": "zz-no-such"}).text) == []


def test_runs_pages_walk_every_run_once_both_ways(rt, client):
    rt.publish(manifest([("solo", [])]), now_ms=T0)
    # 60 Runs; admitted in threes at the same millisecond, so the cursor needs its tie-break
    admitted = {}
    for i in range(60):
        at_ms = T0 + (i // 3) * 10
        admitted[rt.start("demo", "flow", admission_key=f"k{i:02d}", now_ms=at_ms).run_id] = at_ms
    newest_first = sorted(admitted, key=lambda run_id: (-admitted[run_id], run_id))
    pages, url = [], "/runs?limit=25"
    while url:
        html = client.get(url).text
        pages.append(listed(html))
        older = re.search(r'<a rel="next" href="([^"]+)"', html)
        url = older.group(1).replace("&amp;", "&") if older else None
    assert [len(p) for p in pages] == [25, 25, 10]
    assert [r for page in pages for r in page] == newest_first
    # and back: "newer" from the last page gives the pages again
    html = client.get(f"/runs?limit=25&before={_cursor(rt, pages[1][-1])}").text
    assert listed(html) == pages[2]
    newer = re.search(r'<a rel="prev" href="([^"]+)"', html).group(1).replace("&amp;", "&")
    assert listed(client.get(newer).text) == pages[1]
    assert 'rel="prev"' not in client.get("/runs?limit=25").text


def _cursor(rt, run_id: str) -> str:
    return f"{rt.get_run(run_id).admitted_at_ms}.{run_id}"


def test_run_page_of_a_failed_run(client, ids):
    run_id = ids["failed"]
    response = client.get(f"/runs/{run_id}")
    assert response.status_code == 200
    html = response.text
    nodes = dict(
        re.findall(
            r'class="node st-[a-z_]+" href="[^"]+" data-step="([^"]+)" '
            r'data-status="([^"]+)"',
            html,
        )
    )
    assert nodes == {"a": "succeeded", "b": "failed", "c": "succeeded", "d": "skipped"}
    assert re.search(r'data-step="b" data-status="failed" data-attempts="1"', html)
    assert "Root cause" in html and 'data-cause-step="b"' in html
    assert "execution_failed" in html and "Skipped because of it" in html
    assert 'data-live="0"' in html and 'data-action="cancel"' not in html
    assert "workflow.failed" in html and "attempt.failed" in html
    assert "step_run.mutated" not in html, "mutations repeat their step event"


def test_run_page_of_a_running_run(client, ids):
    html = client.get(f"/runs/{ids['running']}").text
    assert "Why it is still running" in html
    assert re.search(r'<tr class="blocked">\s*<td>blocked</td>\s*<td><a [^>]*>a</a>', html)
    assert "w-live" in html
    assert 'data-live="1"' in html and 'data-action="cancel"' in html
    assert re.search(r'data-step="a" data-status="running" data-attempts="1"', html)
    assert re.search(r'data-step="d" data-status="pending" data-attempts="0"', html)
    # the timeline's sentences show instants as local times, not epoch milliseconds
    expires = T0 + 2000 + 600_000
    assert f'until <time class="local" datetime="{iso(expires)}" data-ms="{expires}"' in html
    assert f"until {expires}" not in html


def test_run_page_of_a_cancelled_run_names_the_intent(client, ids):
    html = client.get(f"/runs/{ids['cancelled']}").text
    assert "Cancelled (reason <b>user</b>)" in html
    assert re.search(r'data-step="load" data-status="cancelled"', html)


def test_step_page_shows_attempts_result_codes_and_a_logs_section(client, ids):
    run_id = ids["failed"]
    response = client.get(f"/runs/{run_id}/steps/b")
    assert response.status_code == 200
    html = response.text
    row = re.search(r'<tr data-attempt="[^"]+" data-status="failed">(.*?)</tr>', html, re.S)
    assert row and "execution_failed" in row.group(1) and "w1" in row.group(1)
    assert 'id="logs"' in html
    assert "attempt.failed" in html and "step.failed" in html
    skipped = client.get(f"/runs/{run_id}/steps/d").text
    assert "No Attempt yet" in skipped and "dependency_not_succeeded" in skipped


def test_packages_page_shows_generations_heads_and_trust(rt, client, ids):
    second = rt.publish(manifest([("a", [])]), now_ms=T0 + 5000)
    rt.withdraw(second.publication_id, now_ms=T0 + 5001)
    (other,) = rt.packages("other")
    rt.quarantine(other.head.publication_id, now_ms=T0 + 5001)
    rt.revoke_publisher("acme", now_ms=T0 + 5002)
    response = client.get("/packages")
    assert response.status_code == 200
    html = response.text
    demo = html[html.index('data-installation="demo"') : html.index('data-installation="other"')]
    assert '<tr data-generation="2" data-status="withdrawn">' in demo
    assert '<tr data-generation="1" data-status="active">' in demo
    assert "head generation <b>2</b>" in demo
    assert "revoked" in demo and 'data-workflow="flow"' in demo
    rest = html[html.index('data-installation="other"') :]
    assert '<tr data-generation="1" data-status="quarantined">' in rest
    assert "the head is quarantined; starting is refused" in rest


@pytest.mark.parametrize(
    "path",
    [
        "/runs/run:0000000000000000",
        "/runs/no-such-run/live",
        "/runs/no-such-run/steps/a",
        "/nowhere",
    ],
)
def test_unknown_ids_are_a_404_page(client, ids, path):
    response = client.get(path)
    assert response.status_code == 404
    assert '<section class="error" data-status="404">' in response.text


def test_unknown_step_of_a_known_run_is_a_404(client, ids):
    response = client.get(f"/runs/{ids['failed']}/steps/zz")
    assert response.status_code == 404
    assert "has no step" in response.text


@pytest.mark.parametrize(
    "params",
    [{"status": "bogus"}, {"since": "yesterday"}, {"before": "nonsense"}, {"limit": "7"}],
)
def test_bad_filters_are_a_400_page(client, params):
    response = client.get("/runs", params=params)
    assert response.status_code == 400
    assert '<section class="error" data-status="400">' in response.text


def test_static_files_and_security_headers(client):
    script = client.get("/static/app.js")
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]
    page = client.get("/runs")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
