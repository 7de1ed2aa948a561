"""The Jinja2 environment: autoescape on for every template, and the filters the
pages use to show ids, times and links."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import jinja2
from starlette.templating import Jinja2Templates

from domain.rerun import runs_again_by_default
from qlflow.ui import times, values
from qlflow.ui.data import DEFAULT_PAGE_SIZE, PAGE_SIZES, RUN_STATUSES, short_id
from qlflow.ui.schedule_list import next_fire_zoned

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def run_url(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe=':')}"


def step_url(run_id: str, step_key: str) -> str:
    return f"{run_url(run_id)}/steps/{quote(step_key, safe='')}"


def tail_url(run_id: str, attempt_id: str) -> str:
    """Where a live tail polls for an Attempt's new log lines."""
    return f"{run_url(run_id)}/attempts/{quote(attempt_id, safe=':')}/log"


def start_url(package: str, workflow: str) -> str:
    """The start form of `workflow` of `package`."""
    return "/start?" + urlencode({"package": package, "workflow": workflow})


def schedule_url(schedule_id: str, action: str) -> str:
    """Where a schedule's pause or resume action posts."""
    return f"/schedules/{quote(schedule_id, safe=':')}/{action}"


# the header's pages: (the `nav` a page renders with, its label, its address);
# a new page is a route, a template and an entry here
NAV_ITEMS = (
    ("runs", "Runs", "/runs"),
    ("schedules", "Schedules", "/schedules"),
    ("packages", "Packages", "/packages"),
    ("workers", "Workers", "/workers"),
)

# how the step page marks each stream of a log
STREAM_LABELS = {"stdout": "out", "stderr": "err", "qlflow": "qlflow", "dropped": "…"}


def runs_url(**params: object) -> str:
    """/runs with the given filters (empty values left out)."""
    kept = {k: str(v) for k, v in params.items() if v not in (None, "")}
    return "/runs" + (f"?{urlencode(kept)}" if kept else "")


def store_label(url: str) -> str:
    """The store's URL without credentials or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    if parts.username:
        host = f"{parts.username}@{host}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every value from the store is user data
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        local=times.local,
        iso=times.iso,
        duration=times.duration,
        relative=times.relative,
        instants=times.readable_instants,
        short_id=short_id,
        run_url=run_url,
        json_text=values.json_text,
        param_value=values.param_value,
        next_fire_zoned=next_fire_zoned,
    )
    env.globals.update(
        step_url=step_url,
        tail_url=tail_url,
        start_url=start_url,
        schedule_url=schedule_url,
        clipped=values.clipped,
        stream_labels=STREAM_LABELS,
        nav_items=NAV_ITEMS,
        runs_url=runs_url,
        run_statuses=RUN_STATUSES,
        page_sizes=PAGE_SIZES,
        default_page_size=str(DEFAULT_PAGE_SIZE),
        runs_again_by_default=runs_again_by_default,
    )
    return env


def templates() -> Jinja2Templates:
    return Jinja2Templates(env=environment())
