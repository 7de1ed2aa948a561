"""The workers page on both stores: each worker that runs an Attempt or was seen in
the last hour, with its host, slots, what it runs and its last renewal."""

from __future__ import annotations

from tests.ui.support import T0

MANIFEST = {
    "package": {"name": "fleet", "publisher": "acme"},
    "tasks": {"t": {"command": ["true"]}},
    "workflows": {"flow": {"steps": [{"key": "a", "task": "t"}]}},
}


def test_workers_page_lists_each_worker(rt, client, clock):
    rt.publish(MANIFEST, now_ms=T0)
    rt.start("fleet", "flow", admission_key="k", now_ms=T0)
    (lease,) = rt.lease_attempts(
        "box-1-42", ttl_ms=30_000, now_ms=T0, start=True, slots=4, host="<b>box</b>"
    )
    rt.renew(lease, ttl_ms=30_000, now_ms=T0 + 10_000)
    clock.now_ms = T0 + 20_000
    response = client.get("/workers")
    assert response.status_code == 200
    html = response.text
    row = html[html.index('<tr data-worker="box-1-42" data-running="1">') :]
    row = row[: row.index("</tr>")]
    assert "<td>&lt;b&gt;box&lt;/b&gt;</td>" in row  # user data, escaped
    assert "<td>4</td>" in row and f'data-ms="{T0 + 10_000}"' in row
    assert "expired" not in row
    assert '<a href="/workers" aria-current="page">Workers</a>' in html
    clock.now_ms = T0 + 40_000  # the lease ran out, nobody recovered it yet
    assert "1 expired" in client.get("/workers").text


def test_no_workers_says_who_would_be_listed(client):
    assert "No workers seen in the last hour" in client.get("/workers").text
