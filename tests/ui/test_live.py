"""The fragment a running Run's page polls: 204 while nothing changed, the new body
(and its stamp) after any change, including a lease renewal."""

from __future__ import annotations

import re

from tests.ui.support import T0, manifest


def poll(client, run_id: str, stamp: str = ""):
    return client.get(f"/runs/{run_id}/live", params={"stamp": stamp} if stamp else None)


def node_status(html: str, key: str) -> str:
    match = re.search(rf'data-step="{key}" data-status="([a-z_]+)"', html)
    assert match, key
    return match.group(1)


def test_the_fragment_follows_every_change_until_the_run_ends(rt, client):
    rt.publish(manifest([("a", []), ("b", ["a"])]), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    page = client.get(f"/runs/{run_id}").text
    stamp = re.search(r'data-stamp="([0-9a-f]+)"', page).group(1)
    assert poll(client, run_id, stamp).status_code == 204

    (lease,) = rt.lease_attempts("w1", now_ms=T0 + 1)  # a leased (the start claimed it)
    first = poll(client, run_id, stamp)
    assert first.status_code == 200
    assert first.headers["x-qlflow-live"] == "1"
    assert first.headers["cache-control"] == "no-store"
    assert first.headers["x-qlflow-stamp"] != stamp
    assert "<html" not in first.text and 'class="run-head"' in first.text
    stamp = first.headers["x-qlflow-stamp"]
    assert poll(client, run_id, stamp).status_code == 204

    lease = rt.mark_running(lease, now_ms=T0 + 3)
    running = poll(client, run_id, stamp)
    assert node_status(running.text, "a") == "running"
    stamp = running.headers["x-qlflow-stamp"]

    lease = rt.renew(lease, now_ms=T0 + 4)  # the Run's version stays; the lease moves
    renewed = poll(client, run_id, stamp)
    assert renewed.status_code == 200 and renewed.headers["x-qlflow-stamp"] != stamp
    stamp = renewed.headers["x-qlflow-stamp"]

    rt.complete(lease, "succeeded", now_ms=T0 + 5)
    rt.cycle(now_ms=T0 + 6)
    (lease,) = rt.lease_attempts("w1", now_ms=T0 + 7)
    rt.mark_running(lease, now_ms=T0 + 7)
    rt.complete(lease, "succeeded", now_ms=T0 + 8)
    rt.cycle(now_ms=T0 + 9)
    last = poll(client, run_id, stamp)
    assert last.status_code == 200
    assert last.headers["x-qlflow-live"] == "0"
    assert node_status(last.text, "b") == "succeeded" and "Root cause" in last.text


def test_the_step_page_polls_its_body_until_the_step_ends(rt, client):
    rt.publish(manifest([("a", [])]), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    url = f"/runs/{run_id}/steps/a"
    page = client.get(url).text
    assert f'data-live-url="{url}?live=1"' in page and 'data-live="1"' in page
    stamp = re.search(r'id="step-body"[^>]*data-stamp="([0-9a-f]+)"', page).group(1)

    def step_poll(known: str):
        return client.get(url, params={"live": "1", "stamp": known})

    assert step_poll(stamp).status_code == 204
    (lease,) = rt.lease_attempts("w1", now_ms=T0 + 1)  # the start's claim, leased
    lease = rt.mark_running(lease, now_ms=T0 + 3)
    running = step_poll(stamp)
    assert running.status_code == 200 and running.headers["x-qlflow-live"] == "1"
    assert "<html" not in running.text and 'id="attempt-1"' in running.text
    stamp = running.headers["x-qlflow-stamp"]
    rt.append_log(lease.attempt_id, [("stdout", T0 + 4, b"hello\n")])
    assert step_poll(stamp).status_code == 204, "log output is the tail's, not the body's"
    rt.complete(lease, "succeeded", now_ms=T0 + 5)
    rt.cycle(now_ms=T0 + 6)
    done = step_poll(stamp)
    assert done.status_code == 200 and done.headers["x-qlflow-live"] == "0"
    assert 'data-role="status">succeeded<' in done.text and "hello" in done.text
    assert client.get(f"/runs/{run_id}/steps/zz", params={"live": "1"}).status_code == 404
