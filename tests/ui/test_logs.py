"""Step logs in the dashboard, on both stores: the step page's lines per Attempt
(streams marked, times readable, markup escaped), the failed Run's last lines on its
page, and the live tail's endpoint returning only what was appended after its place."""

from __future__ import annotations

import re

import pytest

from qlflow.ui.data import LOG_LINES
from qlflow.ui.times import local
from tests.ui.support import T0, manifest, scenario

ESCAPED = "&lt;script&gt;alert(6)&lt;/script&gt;"


@pytest.fixture
def ids(rt):
    return scenario(rt)


def attempt_of(rt, run_id: str, step_key: str) -> str:
    (named,) = rt.log_attempts(run_id, step_key)
    return named.attempt_id


def rows(html: str) -> list[tuple[str, str, str]]:
    """(stream, end flag, text) of every log line in `html`."""
    return re.findall(
        r'<tr class="line s-[a-z]+" data-seq="\d+" data-stream="([a-z]+)" '
        r'data-end="([01])"[^>]*>.*?<td class="x">(.*?)</td></tr>',
        html,
        re.S,
    )


def tail(client, run_id: str, attempt_id: str, after: int = 0, **params):
    return client.get(
        f"/runs/{run_id}/attempts/{attempt_id}/log", params={"after": str(after), **params}
    )


def test_step_page_shows_each_attempts_lines_escaped_with_streams_and_times(rt, client, ids):
    run_id = ids["failed"]
    attempt_id = attempt_of(rt, run_id, "b")
    rt.append_log(
        attempt_id,
        [
            ("stdout", T0 + 10, b"starting\npar"),
            ("stdout", T0 + 11, b"tial line\n"),
            ("stderr", T0 + 12, b"<script>alert(6)</script>\n"),
            ("qlflow", T0 + 13, b"exit code 3\n"),
        ],
    )
    response = client.get(f"/runs/{run_id}/steps/b")
    assert response.status_code == 200
    html = response.text
    assert rows(html) == [
        ("stdout", "1", "starting"),
        ("stdout", "1", "partial line"),  # a line cut between two chunks is one line
        ("stderr", "1", ESCAPED),
        ("qlflow", "1", "exit code 3"),
    ]
    assert "<script>alert(6)" not in html
    assert f'data-ms="{T0 + 12}">{local(T0 + 12)}</time>' in html
    assert 'id="attempt-1"' in html and 'data-live="0"' in html  # ended: no tail
    assert "log_path" not in html
    quiet = client.get(f"/runs/{run_id}/steps/a").text  # an Attempt that wrote nothing
    assert rows(quiet) == [] and "This Attempt wrote no output." in quiet


def test_failed_run_page_shows_the_failing_steps_last_lines_and_links_its_log(rt, client, ids):
    run_id = ids["failed"]
    attempt_id = attempt_of(rt, run_id, "b")
    lines = b"".join(b"line %d\n" % i for i in range(15)) + b"<script>alert(6)</script>\n"
    rt.append_log(attempt_id, [("stdout", T0 + 10, lines)])
    html = client.get(f"/runs/{run_id}").text
    failure = re.search(
        r'<div class="failure" data-step="b" data-status="failed">(.*?)</div>', html, re.S
    )
    assert failure, "the failed step is listed"
    block = failure.group(1)
    assert 'href="/runs/' + run_id + '/steps/b#attempt-1">its log</a>' in block
    shown = re.search(r'<pre class="last-lines"[^>]*>(.*?)</pre>', block, re.S).group(1)
    assert shown.splitlines() == [f"line {i}" for i in range(6, 15)] + [ESCAPED]
    assert "<script>alert(6)" not in html
    assert f'href="/runs/{run_id}/steps/b#logs">Its log</a>' in html  # from the root cause


def test_live_tail_returns_only_the_lines_appended_after_its_place(rt, client, ids):
    run_id = ids["running"]
    attempt_id = ids["lease"].attempt_id
    page = client.get(f"/runs/{run_id}/steps/a").text
    assert 'data-live="1"' in page and "No output yet" in page
    assert f'data-tail-url="/runs/{run_id}/attempts/{attempt_id}/log" data-after="0"' in page

    empty = tail(client, run_id, attempt_id)
    assert empty.status_code == 200 and rows(empty.text) == []
    assert empty.headers["x-qlflow-after"] == "0" and empty.headers["x-qlflow-live"] == "1"
    assert empty.headers["x-qlflow-status"] == "running"
    assert empty.headers["cache-control"] == "no-store"

    rt.append_log(attempt_id, [("stdout", T0 + 2100, b"one\ntw")])
    first = tail(client, run_id, attempt_id)
    assert rows(first.text) == [("stdout", "1", "one"), ("stdout", "0", "tw")]
    place = int(first.headers["x-qlflow-after"])
    assert place > 0
    nothing = tail(client, run_id, attempt_id, place, open="stdout")
    assert rows(nothing.text) == [] and nothing.headers["x-qlflow-after"] == str(place)

    rt.append_log(
        attempt_id,
        [("stdout", T0 + 2200, b"o\n"), ("stderr", T0 + 2201, b"<script>alert(6)</script>\n")],
    )
    later = tail(client, run_id, attempt_id, place, open="stdout")
    assert rows(later.text) == [("stdout", "1", "o"), ("stderr", "1", ESCAPED)]
    assert 'data-continues="1"' in later.text  # the page joins "tw" + "o"
    assert "<script>alert(6)" not in later.text
    place = int(later.headers["x-qlflow-after"])

    rt.append_log(attempt_id, [("stdout", T0 + 2300, b"bye\n")])
    rt.complete(ids["lease"], "succeeded", now_ms=T0 + 2301)
    last = tail(client, run_id, attempt_id, place)
    assert rows(last.text) == [("stdout", "1", "bye")]
    assert last.headers["x-qlflow-status"] == "succeeded"
    assert last.headers["x-qlflow-live"] == "1"  # one more poll, after the end
    done = tail(client, run_id, attempt_id, int(last.headers["x-qlflow-after"]))
    assert rows(done.text) == [] and done.headers["x-qlflow-live"] == "0"


def test_live_tail_refuses_unknown_ids_and_bad_places(rt, client, ids):
    failed = ids["failed"]
    other = ids["lease"].attempt_id  # an Attempt of another Run
    assert tail(client, "run:0000000000000000", other).status_code == 404
    assert tail(client, failed, other).status_code == 404
    assert tail(client, failed, "wta:nothing").status_code == 404
    attempt_id = attempt_of(rt, failed, "b")
    assert tail(client, failed, attempt_id).status_code == 200
    for params in ({"after": "-1"}, {"after": "x"}, {"after": "0", "open": "<b>"}):
        response = client.get(f"/runs/{failed}/attempts/{attempt_id}/log", params=params)
        assert response.status_code == 400, params
        assert "<b>" not in response.text


def test_a_lost_attempt_keeps_its_log_on_the_page(rt, client):
    rt.publish(manifest([("a", [])]), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    (lease,) = rt.lease_attempts("w1", ttl_ms=5000, now_ms=T0)
    rt.mark_running(lease, now_ms=T0 + 1)
    rt.append_log(lease.attempt_id, [("stdout", T0 + 2, b"first try\n")])
    rt.cycle(now_ms=T0 + 10_000)  # the lease expired before the worker ended: lost
    page = client.get(f"/runs/{run_id}/steps/a").text
    assert ("stdout", "1", "first try") in rows(page)
    assert re.search(r'id="attempt-1".*?data-live="0".*?data-role="status">lost<', page, re.S)


def test_a_long_log_shows_its_last_lines_and_every_line_on_request(rt, client, ids):
    run_id = ids["failed"]
    attempt_id = attempt_of(rt, run_id, "b")
    total = LOG_LINES + 100
    output = b"".join(b"n%d\n" % i for i in range(total))
    rt.append_log(attempt_id, [("stdout", T0 + 777, output)])
    page = client.get(f"/runs/{run_id}/steps/b").text
    shown = rows(page)
    assert len(shown) == LOG_LINES and shown[0][2] == "n100" and shown[-1][2] == f"n{total - 1}"
    assert "100 earlier lines not shown" in page
    assert page.count('<td class="t"><time') == 1  # one read: its time once
    every = client.get(f"/runs/{run_id}/steps/b", params={"lines": "all"}).text
    assert len(rows(every)) == total and "earlier line" not in every
    assert "?live=1&amp;lines=all" in every


def test_the_marker_of_dropped_output_is_one_line_between_head_and_tail(rt, client, ids):
    run_id = ids["failed"]
    attempt_id = attempt_of(rt, run_id, "b")
    rt.log_cap_bytes = 4096  # a small cap: most of what follows is dropped from the middle
    output = b"".join(b"%-39d\n" % i for i in range(1000))
    rt.append_log(attempt_id, [("stdout", T0 + 10, output)])
    shown = rows(client.get(f"/runs/{run_id}/steps/b").text)
    streams = [stream for stream, _end, _text in shown]
    marker = streams.index("dropped")
    assert streams.count("dropped") == 1 and 0 < marker < len(shown) - 1
    assert "bytes of output dropped here" in shown[marker][2]
    assert shown[0][2].strip() == "0" and shown[-1][2].strip() == "999"
