"""The access token off loopback, the Host check on loopback, and `serve`."""

from __future__ import annotations

import io

import pytest
from starlette.testclient import TestClient

import qlflow
import qlflow.ui
from qlflow.ui import create_app, security
from tests.ui.conftest import LOOPBACK, csrf_of
from tests.ui.support import T0, manifest

TOKEN = "s3cret-token-for-tests-0123456789"
REMOTE = "http://10.20.30.40:8321"  # only a Host header: nothing is sent anywhere


@pytest.fixture
def rt(sqlite_url):
    runtime = qlflow.open(sqlite_url)
    runtime.publish(manifest([("a", [])]), now_ms=T0)
    yield runtime
    runtime.close()


@pytest.fixture
def remote(rt):
    app = create_app(rt, token=TOKEN, allow_remote=True, clock=lambda: T0)
    with TestClient(app, base_url=REMOTE, follow_redirects=False) as client:
        yield client


@pytest.mark.parametrize("path", ["/runs", "/packages", "/static/app.css", "/runs/x/live"])
def test_without_the_token_every_request_is_401(remote, path):
    response = remote.get(path)
    assert response.status_code == 401
    assert "/login?token=" in response.text


def test_a_wrong_token_is_403(remote):
    for headers in ({"authorization": f"Bearer {TOKEN}x"}, {"x-qlflow-token": "nope"}):
        assert remote.get("/runs", headers=headers).status_code == 403
    remote.cookies.set(security.TOKEN_COOKIE, "forged")
    assert remote.get("/runs").status_code == 403


def test_the_token_in_a_header_opens_every_page(remote):
    for headers in ({"authorization": f"Bearer {TOKEN}"}, {"x-qlflow-token": TOKEN}):
        assert remote.get("/runs", headers=headers).status_code == 200
        assert remote.get("/packages", headers=headers).status_code == 200


def test_login_sets_the_cookie_that_opens_pages_and_actions(rt, remote):
    assert remote.get("/login", params={"token": "wrong"}).status_code == 403
    assert security.TOKEN_COOKIE not in remote.cookies
    response = remote.get("/login", params={"token": TOKEN})
    assert response.status_code == 303 and response.headers["location"] == "/runs"
    assert "httponly" in response.headers["set-cookie"].lower()
    page = remote.get("/packages")
    assert page.status_code == 200
    started = remote.post(
        "/start", data={"csrf": csrf_of(page.text), "package": "demo", "workflow": "flow"}
    )
    assert started.status_code == 303
    assert len(rt.runs()) == 1


def test_an_action_without_the_token_is_refused_before_anything_runs(rt, remote):
    response = remote.post("/start", data={"package": "demo", "workflow": "flow"})
    assert response.status_code == 401
    assert rt.runs() == []


def test_a_remote_app_needs_a_token(rt):
    with pytest.raises(ValueError, match="access token"):
        create_app(rt, token=None, allow_remote=True)


def test_loopback_refuses_other_host_names(rt):
    app = create_app(rt, token=None, allow_remote=False)
    for base, status in (
        (LOOPBACK, 200),
        ("http://localhost:8321", 200),
        ("http://[::1]:8321", 200),
        ("http://evil.example", 403),  # a rebound name: the page must not be readable
        (REMOTE, 403),
    ):
        with TestClient(app, base_url=base) as client:
            assert client.get("/runs").status_code == status, base


def test_a_token_given_on_loopback_is_still_required(rt):
    app = create_app(rt, token=TOKEN, allow_remote=False)
    with TestClient(app, base_url=LOOPBACK) as client:
        assert client.get("/runs").status_code == 401
        assert client.get("/runs", headers={"x-qlflow-token": TOKEN}).status_code == 200


@pytest.mark.parametrize(
    ("host", "token", "prints_token"),
    [("0.0.0.0", None, True), ("127.0.0.1", None, False), ("10.1.2.3", TOKEN, False)],
)
def test_serve_prints_the_address_and_a_generated_token(
    sqlite_url, monkeypatch, host, token, prints_token
):
    import uvicorn

    served: dict = {}

    def run(app, **options):  # stands in for the server loop; the app is real
        served.update(options)
        with TestClient(app, base_url=f"http://{host}:8399") as client:
            served["anonymous"] = client.get("/runs").status_code
            given = token or _printed_token(out.getvalue())
            if given is not None:
                served["with_token"] = client.get(
                    "/runs", headers={"x-qlflow-token": given}
                ).status_code

    monkeypatch.setattr(uvicorn, "run", run)
    out = io.StringIO()
    qlflow.ui.serve(sqlite_url, host=host, port=8399, token=token, out=out)
    text = out.getvalue()
    assert (served["host"], served["port"]) == (host, 8399)
    assert f"http://{host}:8399/" in text
    printed = _printed_token(text)
    assert (printed is not None) is prints_token
    if token is not None:
        assert token not in text, "a token the caller gave is not echoed"
    if host == "127.0.0.1" and token is None:
        assert served["anonymous"] == 200
    else:
        assert (served["anonymous"], served["with_token"]) == (401, 200)
        assert printed is None or len(printed) >= 32


def _printed_token(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("access token: "):
            return line.removeprefix("access token: ")
    return None


def test_loopback_names():
    assert all(map(security.is_loopback, ["127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost"]))
    assert not any(map(security.is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.com", ""]))


def test_an_app_made_from_a_url_owns_its_runtime(sqlite_url):
    from eventstore.api import StoreUsageError

    app = create_app(sqlite_url, token=None, allow_remote=False)
    runtime = app.state.dashboard.runtime
    with TestClient(app, base_url=LOOPBACK) as client:
        assert client.get("/runs").status_code == 200
    with pytest.raises(StoreUsageError):
        runtime.runs()  # closed at shutdown


def test_serve_leaves_a_runtime_it_was_given_open(rt, monkeypatch):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda app, **options: None)
    qlflow.ui.serve(rt, host="127.0.0.1", port=8399, out=io.StringIO())
    assert rt.runs() == []  # still open: the caller closes it


@pytest.mark.parametrize(
    ("token", "remote", "rule"),
    [("", True, "non_empty"), ("", False, "non_empty"), ("a", True, "min_length"),
     ("x" * 31, True, "min_length"), (None, True, "required")],
)  # fmt: skip
def test_a_missing_empty_or_short_token_is_refused_with_a_clear_message(rt, token, remote, rule):
    with pytest.raises(qlflow.errors.InvalidInput) as caught:
        create_app(rt, token=token, allow_remote=remote)
    assert caught.value.rule == rule
    assert "token" in str(caught.value)


def test_a_short_token_on_loopback_is_allowed(rt):
    create_app(rt, token="a", allow_remote=False)


@pytest.mark.parametrize(("token", "says"), [("", "is empty"), ("a", "at least 32")])
def test_qlflow_ui_refuses_an_empty_or_short_token_off_loopback(sqlite_url, tmp_path, token, says):
    from tests.cli.helpers import qlflow as run_cli

    qlflow.open(sqlite_url).close()
    done = run_cli("ui", "--host", "0.0.0.0", "--token", token, db=sqlite_url, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr
    assert "internal error" not in done.stderr
