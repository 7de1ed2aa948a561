"""A real browser over a real server: headless Chromium (Debian's package) driven by
Playwright, against a SQLite store with a failed Run and a running one.

Skipped when Chromium or Playwright is missing on a developer's machine; under CI
(CI=true) that is a failure instead, so the test can never go quietly missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import qlflow
from qlflow.clock import wall_clock_ms
from qlflow.ui import create_app
from tests.ui.support import DIAMOND, drive, manifest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT = Path(__file__).resolve().parents[2] / "bench" / "results" / "ui-run.png"
LOG_SCREENSHOT = SCREENSHOT.with_name("ui-step-log.png")
LAST_LINE = "error: <script>alert(1)</script> could not write the archive"
WAIT_MS = 10_000  # the page must converge well within this; the live poll is 1 s


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        return f"chromium is not installed at {CHROMIUM} (apt-get install -y chromium)"
    return None


MISSING = _missing()
if MISSING and os.environ.get("CI") == "true":
    raise RuntimeError(f"the browser test cannot run under CI: {MISSING}")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(MISSING is not None, reason=f"browser test skipped: {MISSING}"),
]


@contextlib.contextmanager
def serving(app) -> Iterator[str]:
    """Serve `app` on a free loopback port in a thread; yield its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


def test_a_person_finds_the_failure_and_cancels_a_running_run(sqlite_url):
    from playwright.sync_api import expect, sync_playwright

    rt = qlflow.open(sqlite_url)
    try:
        now = wall_clock_ms()
        rt.publish(manifest(DIAMOND, package="backup", workflow="nightly"), now_ms=now - 600_000)
        failed = rt.start("backup", "nightly", admission_key="last-night", now_ms=now - 540_000)
        drive(rt, now - 540_000, outcomes={"c": "failed"})
        (failing,) = rt.log_attempts(failed.run_id, "c")
        output = b"copying /var/backups\n<b>disk full</b>: 0 bytes left\n"
        rt.append_log(failing.attempt_id, [("stdout", now - 539_000, output)])
        rt.append_log(failing.attempt_id, [("stderr", now - 539_000, LAST_LINE.encode() + b"\n")])
        running = rt.start("backup", "nightly", admission_key="now", now_ms=now - 30_000)
        rt.cycle(now_ms=now - 30_000)
        (lease,) = rt.lease_attempts("worker-7", ttl_ms=600_000, now_ms=now - 29_000)
        lease = rt.mark_running(lease, now_ms=now - 29_000)

        app = create_app(rt, token=None, allow_remote=False)
        with serving(app) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))

            page.goto(f"{base}/runs")
            expect(page.locator("tr[data-run]")).to_have_count(2)
            page.locator(f'tr[data-run="{failed.run_id}"] a.id').click()
            page.wait_for_url(f"**/runs/{failed.run_id}")
            failed_node = page.locator('svg.dag a.node[data-step="c"]')
            expect(failed_node).to_have_attribute("data-status", "failed")
            expect(page.locator('svg.dag a.node[data-status="failed"]')).to_have_count(1)
            expect(page.locator('svg.dag a.node[data-step="d"]')).to_have_attribute(
                "data-status", "skipped"
            )
            expect(page.locator(".why .cause")).to_contain_text("execution_failed")
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)

            failure = page.locator('.failure[data-step="c"]')
            expect(failure.locator("pre.last-lines")).to_contain_text(LAST_LINE)
            failure.locator("a.log-link").click()  # the failure links the step's log
            page.wait_for_url(f"**/runs/{failed.run_id}/steps/c#attempt-1")
            expect(page.locator('tr[data-status="failed"]')).to_contain_text("execution_failed")
            log = page.locator("#attempt-1 table.log tr.line")
            expect(log).to_have_count(3)
            expect(log.last).to_have_attribute("data-stream", "stderr")
            expect(log.last.locator("td.x")).to_have_text(LAST_LINE)  # shown, not run
            expect(log.nth(1).locator("td.x")).to_have_text("<b>disk full</b>: 0 bytes left")
            page.screenshot(path=str(LOG_SCREENSHOT), full_page=True)

            # a running step's log grows on its page as the worker writes
            page.goto(f"{base}/runs/{running.run_id}/steps/a")
            tailing = page.locator("#attempt-1")
            expect(tailing).to_have_attribute("data-live", "1")
            rt.append_log(lease.attempt_id, [("stdout", wall_clock_ms(), b"step 1 of 2\nstep 2")])
            expect(tailing.locator("tr.line td.x").first).to_have_text(
                "step 1 of 2", timeout=WAIT_MS
            )
            rt.append_log(lease.attempt_id, [("stdout", wall_clock_ms(), b" of 2\n")])
            expect(tailing.locator("tr.line td.x").last).to_have_text(
                "step 2 of 2", timeout=WAIT_MS
            )
            expect(tailing.locator("tr.line")).to_have_count(2)

            page.goto(f"{base}/runs/{running.run_id}")
            expect(page.locator(".why")).to_contain_text("worker-7")
            page.locator('button[data-action="cancel"]').click()
            expect(page.locator(".notice")).to_contain_text("Cancel requested")
            page.evaluate("window.__sameDocument = true")  # gone if the page reloads

            # the host's cycle converges what it may; the worker learns to stop, finishes
            rt.cycle(now_ms=wall_clock_ms())
            node = page.locator('svg.dag a.node[data-step="d"]')
            expect(node).to_have_attribute("data-status", "cancelled", timeout=WAIT_MS)
            expect(page.locator(".run-head .badge").first).to_have_text("running")
            lease = rt.renew(lease, ttl_ms=600_000, now_ms=wall_clock_ms())
            assert lease.stop_requested
            rt.complete(lease, "succeeded", now_ms=wall_clock_ms())
            rt.cycle(now_ms=wall_clock_ms())
            expect(page.locator(".run-head .badge").first).to_have_text(
                "cancelled", timeout=WAIT_MS
            )
            expect(page.locator(".why")).to_contain_text("Cancelled (reason user)")
            assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
            assert rt.get_run(running.run_id).status == "cancelled"

            page.locator('header nav a[href="/schedules"]').click()  # the header's page
            page.wait_for_url("**/schedules")
            expect(page.locator("main h1")).to_have_text("Schedules")
            expect(page.locator("main .empty")).to_contain_text("No schedules")
            assert errors == []
            browser.close()
    finally:
        rt.close()
