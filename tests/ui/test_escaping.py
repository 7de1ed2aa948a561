"""Every value from the store is user data: markup in it is shown, never run."""

from __future__ import annotations

from urllib.parse import quote

from tests.ui.support import HOSTILE, T0, forge_run, manifest

ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
KEY = '"><script>alert(2)</script>'
WORKER = "<script>alert(3)</script>"
CODE = "<img src=x onerror=alert(4)>"
OUTPUT = {"note": "<script>alert(5)</script>", "<b>name</b>": "x"}


def assert_inert(html: str) -> None:
    for number in range(1, 6):
        assert f"<script>alert({number})" not in html
    assert "<img src=x" not in html
    assert "<b>name</b>" not in html


def test_a_script_step_key_is_escaped_everywhere(rt, client):
    run_id = forge_run(rt, "forged-1", HOSTILE, T0, admission_key=KEY)
    rt.cycle(now_ms=T0 + 1)  # claims an Attempt for the step: why names it too
    pages = {
        "runs": client.get("/runs"),
        "run": client.get(f"/runs/{run_id}"),
        "live": client.get(f"/runs/{run_id}/live"),
        "step": client.get(f"/runs/{run_id}/steps/{quote(HOSTILE, safe='')}"),
    }
    for name, response in pages.items():
        assert response.status_code == 200, name
        assert_inert(response.text)
    run_page = pages["run"].text
    assert ESCAPED in run_page  # DAG node, step table, why and timeline show it as text
    assert f'data-step="{ESCAPED}"' in run_page
    assert "&#34;&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in run_page  # the admission key
    assert quote(HOSTILE, safe="") in run_page  # links carry it URL-encoded
    assert f'Step <code class="id">{ESCAPED}</code>' in pages["step"].text


def test_worker_ids_result_codes_and_outputs_are_escaped(rt, client):
    rt.publish(manifest([("a", [])]), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="k", now_ms=T0).run_id
    rt.cycle(now_ms=T0)
    (lease,) = rt.lease_attempts(WORKER, now_ms=T0)
    rt.mark_running(lease, now_ms=T0)
    rt.complete(lease, "failed", result_code=CODE, output=OUTPUT, now_ms=T0 + 1)
    running = client.get(f"/runs/{run_id}").text
    assert_inert(running)
    rt.cycle(now_ms=T0 + 2)
    for path in (f"/runs/{run_id}", f"/runs/{run_id}/steps/a", "/runs"):
        response = client.get(path)
        assert response.status_code == 200
        assert_inert(response.text)
    step = client.get(f"/runs/{run_id}/steps/a").text
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in step  # the worker
    assert "&lt;img src=x onerror=alert(4)&gt;" in step  # the result code
    assert "&lt;script&gt;alert(5)&lt;/script&gt;" in step  # the output
