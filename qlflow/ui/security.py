"""Who may use the dashboard: the access token, the loopback Host check, and CSRF.

- Bound to anything but loopback, every request must present the access token: an
  `Authorization: Bearer …` or `X-Qlflow-Token` header, or the cookie `/login?token=…`
  sets. Missing: 401; wrong: 403. `/login` itself checks the token it is given.
- Bound to loopback, a request whose Host is not a loopback name is refused (403):
  a page of another site that rebinds its own name to 127.0.0.1 must not read or
  drive the dashboard.
- Every POST carries a CSRF token: a value this process issued (a random nonce and
  its HMAC under a per-process secret) in a cookie and the same value in the form's
  hidden field (signed double submit). A cross-site form cannot read the cookie, so
  it cannot send a matching field, and a cookie the server never issued (one planted
  by a sibling site) does not verify. A POST whose Origin is another host, or the
  opaque `null` (a sandboxed frame, a `data:` page), is refused.
- Off loopback the access token has at least MIN_TOKEN_CHARS characters.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import ipaddress
import re
import secrets
from collections.abc import Mapping
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from domain.errors import InvalidInput

TOKEN_COOKIE = "qlflow_token"
TOKEN_HEADER = "x-qlflow-token"
CSRF_COOKIE = "qlflow_csrf"
CSRF_FIELD = "csrf"
LOGIN_PATH = "/login"
_TOKEN_BYTES = 24
MIN_TOKEN_CHARS = 32  # what new_token gives: 192 random bits
_CSRF_SHAPE = re.compile(r"[A-Za-z0-9_-]{32}\.[A-Za-z0-9_-]{43}")
_CSRF_SECRET = secrets.token_bytes(32)  # per process: a restart asks forms to reload


def new_token() -> str:
    """A fresh access token or nonce (URL-safe, 32 characters)."""
    return secrets.token_urlsafe(_TOKEN_BYTES)


def check_access_token(token: str | None, remote: bool) -> None:
    """InvalidInput unless `token` may guard a dashboard (`remote`: reachable from
    other hosts, so it needs one of at least MIN_TOKEN_CHARS characters)."""
    if token is None:
        if remote:
            raise InvalidInput(
                "token", "required", "a dashboard reachable from other hosts needs an access token"
            )
        return
    if not isinstance(token, str) or not token.strip():
        raise InvalidInput(
            "token",
            "non_empty",
            "the access token is empty: give one of at least "
            f"{MIN_TOKEN_CHARS} characters, or leave --token out to have one generated",
        )
    if remote and len(token) < MIN_TOKEN_CHARS:
        raise InvalidInput(
            "token",
            "min_length",
            f"the access token has {len(token)} characters; a dashboard reachable from other "
            f"hosts needs at least {MIN_TOKEN_CHARS} (leave --token out to have one generated)",
        )


def _csrf_signature(nonce: str) -> str:
    digest = hmac.new(_CSRF_SECRET, nonce.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def new_csrf_token() -> str:
    """A CSRF token this process can verify: `<nonce>.<HMAC of the nonce>`."""
    nonce = new_token()
    return f"{nonce}.{_csrf_signature(nonce)}"


def issued_csrf_token(token: object) -> bool:
    """Whether `token` is one this process issued (its signature verifies)."""
    if not isinstance(token, str) or not _CSRF_SHAPE.fullmatch(token):
        return False
    nonce, _, signature = token.partition(".")
    return hmac.compare_digest(signature, _csrf_signature(nonce))


def is_loopback(host: str) -> bool:
    """Whether a bind address or Host name stays on this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    """The name part of a Host header ("[::1]:8321" -> "::1", "a:80" -> "a")."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def same_token(presented: str | None, expected: str) -> bool:
    return presented is not None and secrets.compare_digest(
        presented.encode("utf-8", "surrogatepass"), expected.encode()
    )


def _page(status: int, title: str, message: str) -> Response:
    body = (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{status} "
        f"{html.escape(title)}</title><link rel='stylesheet' href='/static/app.css'></head>"
        f"<body><main class='error'><h1>{status} {html.escape(title)}</h1>"
        f"<p>{html.escape(message)}</p></main></body></html>"
    )
    return HTMLResponse(body, status_code=status)


def presented_token(headers: Mapping[str, str], cookies: Mapping[str, str]) -> str | None:
    """The access token a request carries, from a header or the login cookie."""
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get(TOKEN_HEADER) or cookies.get(TOKEN_COOKIE)


class AccessGate:
    """ASGI middleware: the Host check (loopback) and the access token (when set)."""

    def __init__(self, app: ASGIApp, *, token: str | None, allow_remote: bool) -> None:
        self.app = app
        self.token = token
        self.allow_remote = allow_remote

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> Response | None:
        if not self.allow_remote and not is_loopback(_host_name(headers.get("host", ""))):
            return _page(
                403,
                "Forbidden",
                "This dashboard serves loopback only; open it as 127.0.0.1 or localhost.",
            )
        if self.token is None or scope["path"] == LOGIN_PATH:
            return None
        cookies: dict[str, str] = {}
        if "cookie" in headers:
            parsed = SimpleCookie()
            try:
                parsed.load(headers["cookie"])
            except Exception:  # a malformed Cookie header carries no token
                parsed = SimpleCookie()
            cookies = {name: morsel.value for name, morsel in parsed.items()}
        presented = presented_token(headers, cookies)
        if presented is None:
            return _page(
                401,
                "Access token needed",
                "Open /login?token=… with the token qlflow ui printed when it started, or "
                "send it in an Authorization: Bearer header.",
            )
        if not same_token(presented, self.token):
            return _page(403, "Forbidden", "That access token is not this server's.")
        return None


# --- CSRF -------------------------------------------------------------------------------------


def csrf_token(request: Request) -> str:
    """This browser's CSRF token: the cookie's, or a new one (set by `remember_csrf`)."""
    existing = getattr(request.state, "csrf", None)
    if existing is not None:
        return str(existing)
    token = request.cookies.get(CSRF_COOKIE, "")
    if not issued_csrf_token(token):
        token = new_csrf_token()
        request.state.csrf_new = True
    request.state.csrf = token
    return token


def remember_csrf(request: Request, response: Response) -> None:
    """Set the CSRF cookie on the response if this request minted the token."""
    if getattr(request.state, "csrf_new", False):
        response.set_cookie(CSRF_COOKIE, request.state.csrf, httponly=True, samesite="lax")


def csrf_refusal(request: Request, form_value: object) -> str | None:
    """Why this POST fails the CSRF check, or None if it passes."""
    origin = request.headers.get("origin")
    host = request.headers.get("host", "").lower()
    if origin == "null":
        return "the form was sent from an opaque origin (Origin: null)"
    if origin is not None and urlsplit(origin).netloc.lower() != host:
        return "the form was sent from another site"
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie:
        return "no CSRF cookie: reload the page and try again"
    if not issued_csrf_token(cookie):
        return "the CSRF cookie is not one this server issued: reload the page and try again"
    if not isinstance(form_value, str) or not same_token(form_value, cookie):
        return "the form's CSRF token does not match: reload the page and try again"
    return None
