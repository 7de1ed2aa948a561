"""The web dashboard: runs, a Run's DAG, timeline and why, its steps, packages; cancel
and start. Needs the `ui` extra (Starlette, uvicorn, Jinja2, python-multipart).

    from qlflow.ui import serve
    serve("sqlite:///qlflow.db")                       # http://127.0.0.1:8321/
    serve(url, host="0.0.0.0", port=8321)              # prints a generated access token

Everything goes through one adapter over the public Runtime API (`qlflow.ui.data`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from starlette.applications import Starlette

from qlflow import metrics
from qlflow.clock import wall_clock_ms
from qlflow.runtime import Runtime
from qlflow.ui.app import build
from qlflow.ui.data import Dashboard
from qlflow.ui.security import check_access_token, is_loopback, new_token
from qlflow.ui.templating import store_label

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "create_app", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8321


def create_app(
    url_or_runtime: str | Runtime,
    *,
    token: str | None,
    allow_remote: bool,
    clock: Callable[[], int] | None = None,
) -> Starlette:
    """The dashboard as an ASGI app over a store URL (opened now, closed at shutdown)
    or an opened Runtime (left open: the caller owns it).

    `token`: when set, every request must present it. `allow_remote`: serve Host names
    other than loopback; that needs a token. `clock`: epoch ms for actions and relative
    times (tests pin it; default the wall clock)."""
    check_access_token(token, allow_remote)
    if isinstance(url_or_runtime, Runtime):
        runtime, owned = url_or_runtime, False
    else:
        import qlflow

        runtime, owned = qlflow.open(url_or_runtime), True
    # /metrics reads this runtime's store
    instrumented = metrics.instrument(runtime, clock=clock or wall_clock_ms)

    def shutdown() -> None:
        instrumented.close()
        if owned:
            runtime.close()

    return build(
        Dashboard(runtime, clock),
        token=token,
        allow_remote=allow_remote,
        on_shutdown=shutdown,
    )


def serve(
    url_or_runtime: str | Runtime | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    out: TextIO | None = None,
) -> None:
    """Serve the dashboard until interrupted, on a store URL (default `$QLFLOW_DB`,
    else ./qlflow.db; opened here and closed on exit) or an opened Runtime (left open:
    a command line that opened it with its own options and errors passes it).

    Bound to anything but loopback, every request needs an access token: `token` (at
    least 32 characters; InvalidInput otherwise), or one generated here and printed
    with the address."""
    import uvicorn

    import qlflow

    out = out or sys.stdout
    remote = not is_loopback(host)
    generated = remote and token is None
    if generated:
        token = new_token()
    check_access_token(token, remote)  # before the store is opened
    owned = not isinstance(url_or_runtime, Runtime)
    if isinstance(url_or_runtime, Runtime):
        runtime = url_or_runtime
    else:
        runtime = qlflow.open(url_or_runtime)
    try:
        app = create_app(runtime, token=token, allow_remote=remote)
        shown = f"[{host}]" if ":" in host else host
        print(f"qlflow ui: {store_label(runtime.url)} at http://{shown}:{port}/", file=out)
        if generated:
            print(f"access token: {token}", file=out)
            print(f"open http://{shown}:{port}/login?token={token}", file=out)
        out.flush()
        uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)
    finally:
        if owned:
            runtime.close()
