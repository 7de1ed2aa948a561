"""Routes of the dashboard: server-rendered pages, POST actions (cancel, start, pause
and resume a schedule), and the small fragment endpoints a running Run's page and a
step's live log tail poll.

Handlers parse the request, ask `Dashboard` (in a worker thread: the runtime's calls
block), and render a template; typed errors become an error page with their status.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from domain.errors import (
    AdmissionCollision,
    InvalidInput,
    ManifestError,
    NotFound,
    PlanError,
    StartGuardError,
)
from qlflow import metrics
from qlflow.ui import security, times
from qlflow.ui.data import DEFAULT_PAGE_SIZE, Cursor, Dashboard, RunQuery
from qlflow.ui.starting import form_values
from qlflow.ui.templating import STATIC, STREAM_LABELS, run_url, store_label, templates

# Fixed messages shown after an action (the query names one; nothing is echoed back).
NOTICES = {
    "cancel-requested": "Cancel requested: the next cycles converge the Run.",
    "cancel-existing": "The Run already had a cancel intent.",
    "started": "Run admitted: a cycle claims its first steps.",
    "rerun-started": "Rerun admitted: what succeeded is reused, the rest runs.",
    "rerun-existing": "That rerun already existed: this is its Run.",
    "start-existing": "That admission already existed: this is its Run.",
    "schedule-paused": "Schedule paused: it fires no Run until it is resumed.",
    "schedule-resumed": "Schedule resumed: it fires from its next occurrence.",
    "schedule-unchanged": "The schedule already was in that state.",
}

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    # not no-referrer: under it a browser sends `Origin: null` with its own forms, and
    # the CSRF check refuses null (docs/DESIGN.md, "The dashboard"); no referrer ever
    # leaves for another origin
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}


class Pages:
    """The route handlers over one Dashboard."""

    def __init__(self, dashboard: Dashboard, *, token: str | None) -> None:
        self.dashboard = dashboard
        self.token = token
        self.templates = templates()
        self.store = store_label(dashboard.runtime.url)

    def render(
        self,
        request: Request,
        name: str,
        context: dict[str, Any],
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> Response:
        csrf = security.csrf_token(request)
        notice = NOTICES.get(request.query_params.get("notice", ""))
        response = self.templates.TemplateResponse(
            request,
            name,
            {"csrf": csrf, "store": self.store, "notice": notice, "nav": "runs", **context},
            status_code=status,
            headers={**SECURITY_HEADERS, **(headers or {})},
        )
        security.remember_csrf(request, response)
        return response

    def error(self, request: Request, status: int, title: str, message: str) -> Response:
        return self.render(
            request, "error.html", {"status": status, "title": title, "message": message}, status
        )

    # -- pages ----------------------------------------------------------------------------
    async def home(self, request: Request) -> Response:
        return RedirectResponse("/runs", status_code=303)

    async def runs(self, request: Request) -> Response:
        params = request.query_params
        query = run_query(params)
        page = await run_in_threadpool(self.dashboard.runs, query)
        packages, workflows = await run_in_threadpool(self.dashboard.names)
        form = {name: params.get(name, "") for name in ("package", "workflow", "status", "q")}
        form.update(since=params.get("since", ""), until=params.get("until", ""))
        form["tz"] = params.get("tz", "")
        form["limit"] = str(query.limit)
        return self.render(
            request,
            "runs.html",
            {
                "page": page,
                "query": query,
                "form": form,
                "packages": packages,
                "workflows": workflows,
                "now_ms": self.dashboard.now_ms(),
            },
        )

    async def run(self, request: Request) -> Response:
        detail = await run_in_threadpool(self.dashboard.run, request.path_params["run_id"])
        return self.render(request, "run.html", {"d": detail})

    async def run_live(self, request: Request) -> Response:
        """The run page's body if the Run changed since `stamp`, else 204."""
        run_id = request.path_params["run_id"]
        known = request.query_params.get("stamp", "")
        if known and known == await run_in_threadpool(self.dashboard.stamp, run_id):
            return Response(status_code=204, headers=SECURITY_HEADERS)
        detail = await run_in_threadpool(self.dashboard.run, run_id)
        return self.render(
            request,
            "_run_body.html",
            {"d": detail},
            headers={
                "x-qlflow-stamp": detail.stamp,
                "x-qlflow-live": "0" if detail.run.terminal else "1",
                "cache-control": "no-store",
            },
        )

    async def step(self, request: Request) -> Response:
        """The step page (`lines=all`: every stored log line); with `live=1` its body
        if the step changed since `stamp` (else 204), what the page polls while the
        step has not ended."""
        run_id, step_key = request.path_params["run_id"], request.path_params["step_key"]
        all_lines = request.query_params.get("lines") == "all"
        if request.query_params.get("live") != "1":
            detail = await run_in_threadpool(self.dashboard.step, run_id, step_key, all_lines)
            return self.render(request, "step.html", {"d": detail, "all_lines": all_lines})
        known = request.query_params.get("stamp", "")
        if known and known == await run_in_threadpool(self.dashboard.step_stamp, run_id, step_key):
            return Response(status_code=204, headers=SECURITY_HEADERS)
        detail = await run_in_threadpool(self.dashboard.step, run_id, step_key, all_lines)
        return self.render(
            request,
            "_step_body.html",
            {"d": detail, "all_lines": all_lines},
            headers={
                "x-qlflow-stamp": detail.stamp,
                "x-qlflow-live": "1" if detail.live else "0",
                "cache-control": "no-store",
            },
        )

    async def log_tail(self, request: Request) -> Response:
        """An Attempt's log lines after seq `after`, as table rows (none: still 200).
        Headers: the new place (x-qlflow-after), whether to keep polling
        (x-qlflow-live) and the Attempt's status."""
        params = request.query_params
        after = seq_param(params.get("after", "0"))
        open_stream = params.get("open") or None
        if open_stream is not None and open_stream not in STREAM_LABELS:
            raise InvalidInput("open", "log stream", f"open must be one of {sorted(STREAM_LABELS)}")
        tail = await run_in_threadpool(
            self.dashboard.tail,
            request.path_params["run_id"],
            request.path_params["attempt_id"],
            after,
            open_stream,
        )
        return self.render(
            request,
            "_log_lines.html",
            {"log": tail},
            headers={
                "x-qlflow-after": str(tail.after),
                "x-qlflow-live": "1" if tail.live else "0",
                "x-qlflow-status": tail.status,
                "cache-control": "no-store",
            },
        )

    async def packages(self, request: Request) -> Response:
        installations = await run_in_threadpool(self.dashboard.packages)
        return self.render(
            request,
            "packages.html",
            {"installations": installations, "nav": "packages", "now_ms": self.dashboard.now_ms()},
        )

    async def start_page(self, request: Request) -> Response:
        """The start form of one Workflow: its declared parameters as fields."""
        params = request.query_params
        start_form = await run_in_threadpool(
            self.dashboard.start_form, params.get("package", ""), params.get("workflow", "")
        )
        return self.render(request, "start.html", {"f": start_form, "nav": "packages"})

    async def schedules(self, request: Request) -> Response:
        found = await run_in_threadpool(self.dashboard.schedules)
        return self.render(
            request,
            "schedules.html",
            {"schedules": found, "nav": "schedules", "now_ms": self.dashboard.now_ms()},
        )

    async def workers(self, request: Request) -> Response:
        found = await run_in_threadpool(self.dashboard.workers)
        return self.render(
            request,
            "workers.html",
            {"workers": found, "nav": "workers", "now_ms": self.dashboard.now_ms()},
        )

    async def login(self, request: Request) -> Response:
        if self.token is None:
            return RedirectResponse("/runs", status_code=303)
        presented = request.query_params.get("token")
        if not security.same_token(presented, self.token):
            return self.error(request, 403, "Forbidden", "That access token is not this server's.")
        response = RedirectResponse("/runs", status_code=303)
        response.set_cookie(security.TOKEN_COOKIE, self.token, httponly=True, samesite="lax")
        return response

    # -- actions --------------------------------------------------------------------------
    async def _checked_form(self, request: Request) -> dict[str, str]:
        form = await request.form()
        refusal = security.csrf_refusal(request, form.get(security.CSRF_FIELD))
        if refusal is not None:
            raise HTTPException(403, f"CSRF check failed: {refusal}")
        return {k: v for k, v in form.items() if isinstance(v, str)}

    async def cancel(self, request: Request) -> Response:
        await self._checked_form(request)
        run_id = request.path_params["run_id"]
        recorded = await run_in_threadpool(self.dashboard.cancel, run_id)
        notice = "cancel-requested" if recorded else "cancel-existing"
        return RedirectResponse(f"{run_url(run_id)}?notice={notice}", status_code=303)

    async def rerun(self, request: Request) -> Response:
        """Rerun the Run (from the form's `from` step, if any); a refusal (still
        running, nothing to rerun) is the error page's, nothing admitted."""
        form = await self._checked_form(request)
        run_id = request.path_params["run_id"]
        from_step = form.get("from") or None
        receipt = await run_in_threadpool(self.dashboard.rerun, run_id, from_step)
        notice = "rerun-started" if receipt.status == "created" else "rerun-existing"
        return RedirectResponse(f"{run_url(receipt.run_id)}?notice={notice}", status_code=303)

    async def start(self, request: Request) -> Response:
        """Admit a Run with the form's parameters; a refused binding (InvalidInput)
        shows the form again with the error, nothing started."""
        form = await self._checked_form(request)
        package, workflow = form.get("package", ""), form.get("workflow", "")
        values = form_values(form)
        try:
            receipt = await run_in_threadpool(self.dashboard.start, package, workflow, values)
        except InvalidInput as refused:
            unreadable: tuple[type[BaseException], ...] = (InvalidInput, NotFound)
            try:
                start_form = await run_in_threadpool(
                    self.dashboard.start_form, package, workflow, values
                )
            except (*unreadable, *self.dashboard.denied):
                raise refused from None  # no form to show it on: the error page says it
            name = refused.field.removeprefix("params.") if refused.field else None
            start_form = replace(start_form, error=str(refused), error_field=name)
            return self.render(request, "start.html", {"f": start_form, "nav": "packages"}, 400)
        notice = "started" if receipt.status == "created" else "start-existing"
        return RedirectResponse(f"{run_url(receipt.run_id)}?notice={notice}", status_code=303)

    async def pause(self, request: Request) -> Response:
        return await self._set_paused(request, True)

    async def resume(self, request: Request) -> Response:
        return await self._set_paused(request, False)

    async def _set_paused(self, request: Request, paused: bool) -> Response:
        await self._checked_form(request)
        schedule_id = request.path_params["schedule_id"]
        changed = await run_in_threadpool(self.dashboard.set_paused, schedule_id, paused)
        notice = ("schedule-paused" if paused else "schedule-resumed") if changed else None
        return RedirectResponse(
            f"/schedules?notice={notice or 'schedule-unchanged'}", status_code=303
        )

    # -- errors ---------------------------------------------------------------------------
    async def not_found(self, request: Request, exc: Exception) -> Response:
        message = str(exc) if isinstance(exc, NotFound) else "There is no page at this address."
        return self.error(request, 404, "Not found", message)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return await self.not_found(request, exc)
        return self.error(request, exc.status_code, "Refused", str(exc.detail))

    async def bad_input(self, request: Request, exc: Exception) -> Response:
        return self.error(request, 400, "Bad request", str(exc))

    async def refused(self, request: Request, exc: Exception) -> Response:
        return self.error(request, 409, "Refused", str(exc))

    async def denied(self, request: Request, exc: Exception) -> Response:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return self.error(
            request,
            403,
            "Not allowed for this database role",
            f"The store refused: {first}. Reading pages needs a role that may read every "
            "table (audit); actions need the runtime role.",
        )


def run_query(params: Any) -> RunQuery:
    """The runs page's query string as a RunQuery (InvalidInput names a bad value)."""
    offset = times.parse_offset(params.get("tz"))
    limit_text = params.get("limit", "")
    if limit_text and not limit_text.isdigit():
        raise InvalidInput("limit", "page size", f"limit must be a number, got {limit_text!r}")

    def text(name: str) -> str | None:
        value = params.get(name, "").strip()
        return value or None

    before, after = text("before"), text("after")
    return RunQuery(
        package=text("package"),
        workflow=text("workflow"),
        status=text("status"),
        since_ms=times.parse_instant("since", params.get("since", ""), offset),
        until_ms=times.parse_instant("until", params.get("until", ""), offset),
        id_prefix=text("q"),
        before=Cursor.parse("before", before) if before else None,
        after=Cursor.parse("after", after) if after else None,
        limit=int(limit_text) if limit_text else DEFAULT_PAGE_SIZE,
    )


def seq_param(value: str) -> int:
    """A live tail's `after`: the last seq it read (an integer >= 0)."""
    if not value.isdigit() or len(value) > 16:
        raise InvalidInput("after", "log seq", f"after must be a seq (0 or more), got {value!r}")
    return int(value)


def build(
    dashboard: Dashboard,
    *,
    token: str | None,
    allow_remote: bool,
    on_shutdown: Callable[[], None] | None = None,
) -> Starlette:
    """The ASGI app: routes, static files, error pages, and the access gate."""
    pages = Pages(dashboard, token=token)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if on_shutdown is not None:
                await run_in_threadpool(on_shutdown)

    async def metrics_page(request: Request) -> Response:
        """Prometheus metrics (qlflow.metrics), behind the same access rule as a page."""
        body = await run_in_threadpool(generate_latest, metrics.registry())
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/", pages.home),
        Route("/metrics", metrics_page),
        Route("/runs", pages.runs),
        Route("/runs/{run_id}", pages.run),
        Route("/runs/{run_id}/live", pages.run_live),
        Route("/runs/{run_id}/cancel", pages.cancel, methods=["POST"]),
        Route("/runs/{run_id}/rerun", pages.rerun, methods=["POST"]),
        Route("/runs/{run_id}/attempts/{attempt_id}/log", pages.log_tail),
        Route("/runs/{run_id}/steps/{step_key:path}", pages.step),
        Route("/packages", pages.packages),
        Route("/start", pages.start_page, methods=["GET"]),
        Route("/start", pages.start, methods=["POST"]),
        Route("/schedules", pages.schedules),
        Route("/schedules/{schedule_id}/pause", pages.pause, methods=["POST"]),
        Route("/schedules/{schedule_id}/resume", pages.resume, methods=["POST"]),
        Route("/workers", pages.workers),
        Route(security.LOGIN_PATH, pages.login),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers: dict[Any, Any] = {
        NotFound: pages.not_found,
        HTTPException: pages.http_error,
        InvalidInput: pages.bad_input,
        PlanError: pages.bad_input,
        ManifestError: pages.bad_input,
        StartGuardError: pages.refused,
        AdmissionCollision: pages.refused,
        **dict.fromkeys(dashboard.denied, pages.denied),
    }
    app = Starlette(
        routes=routes,
        exception_handlers=handlers,
        middleware=[Middleware(security.AccessGate, token=token, allow_remote=allow_remote)],
        lifespan=lifespan,
    )
    app.state.dashboard = dashboard
    return app
