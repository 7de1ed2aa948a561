"""One schedule of a Workflow, as the manifest declares it, and its identity.

`schedules = [{ cron = "0 3 * * *", timezone = "UTC", misfire = "skip",
overlap = "skip", params = {...} }]` on a Workflow. `validate_schedules` checks the list and
`validate_schedule` one entry; both raise `ManifestError` naming the file, the table
and the key, e.g.

    qlflow.toml: [workflows.nightly] schedules[0].cron: macros such as '@daily' ...

exactly as the manifest's own checks do (`source`, `table` and `key` attributes),
so the manifest can call them for each Workflow. `schedule_id` derives a schedule's
id; `describe_cron` says an expression in words for a table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cronsim import CronSimError

from domain.canonical import MAX_SAFE_INTEGER, canonical_bytes
from domain.errors import ManifestError
from domain.ids import SCHEDULE_ID, derive_id
from domain.occurrences import parse_cron, zone_names
from domain.text import is_storable_text

SKIP = "skip"  # beyond the grace: admit nothing, move the cursor past now
FIRE_ONCE = "fire_once"  # beyond the grace: admit the oldest missed occurrence only
MISFIRE_POLICIES = (SKIP, FIRE_ONCE)
# what an occurrence does while the schedule's previous Run is still running
# (docs/DESIGN.md, "Schedules", overlap)
OVERLAP_ALLOW = "allow"  # admit it anyway: Runs of the schedule may overlap
OVERLAP_SKIP = "skip"  # admit nothing: `schedule.skipped`, reason "overlap"
OVERLAP_QUEUE = "queue"  # hold it on the cursor and admit it once the previous Run ended
OVERLAP_POLICIES = (OVERLAP_ALLOW, OVERLAP_SKIP, OVERLAP_QUEUE)
# A manifest that says nothing gets `skip`; a stored revision that says nothing was
# published before overlap existed and keeps the behaviour it had: `allow`.
MANIFEST_OVERLAP = OVERLAP_SKIP
STORED_OVERLAP = OVERLAP_ALLOW
SCHEDULE_KEYS = ("cron", "timezone", "misfire", "overlap", "params")
CRON_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
MAX_CRON_CHARS = 256
MAX_DESCRIPTION_CHARS = 72
PARAM_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MANIFEST_FILE = "qlflow.toml"

ParamValue = str | int | bool


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A validated schedule. `cron` is normalized (upper case, single spaces);
    `params` is sorted by name; `overlap` says what an occurrence does while the
    schedule's previous Run still runs (`STORED_OVERLAP` when not stated)."""

    cron: str
    timezone: str
    misfire: str = SKIP
    params: tuple[tuple[str, ParamValue], ...] = ()
    overlap: str = STORED_OVERLAP

    def params_dict(self) -> dict[str, ParamValue]:
        """The parameter values as a dict (what a scheduled admission binds)."""
        return dict(self.params)


def schedule_id(publisher: str, package: str, workflow: str, spec: ScheduleSpec) -> str:
    """The id of a schedule: derived from (publisher, package, workflow key, cron,
    timezone, params). The misfire and overlap policies are not part of it, so changing
    only those keeps the schedule and its cursor."""
    params = canonical_bytes(dict(spec.params)).decode("utf-8")
    return derive_id(SCHEDULE_ID, publisher, package, workflow, spec.cron, spec.timezone, params)


def normalize_cron(cron: str) -> str:
    """The expression with single spaces between fields, in upper case."""
    return " ".join(cron.split()).upper()


def describe_cron(cron: str) -> str:
    """The expression in words ("At 03:00 every day", "Every minute"), as cronsim
    says it; the expression itself when it has no short description."""
    try:
        words = parse_cron(cron).explain()
    except (CronSimError, ValueError, LookupError):
        return cron
    if not words or len(words) > MAX_DESCRIPTION_CHARS:
        return cron
    return words


def validate_schedules(
    raw: Any,
    source: str = MANIFEST_FILE,
    table: str | None = None,
    key: str = "schedules",
    *,
    default_overlap: str = MANIFEST_OVERLAP,
) -> tuple[ScheduleSpec, ...]:
    """Validate a Workflow's `schedules` list, in manifest order. The same schedule
    (cron, timezone and params) twice is refused: it would be one schedule.
    `default_overlap` is what an entry without `overlap` gets: the manifest's
    default, or `STORED_OVERLAP` when reading a stored revision."""
    if not isinstance(raw, list):
        raise _error(source, table, key, f"must be a list of tables, not {_show(raw)}")
    specs: list[ScheduleSpec] = []
    for index, item in enumerate(raw):
        spec = validate_schedule(
            item, source, table, f"{key}[{index}]", default_overlap=default_overlap
        )
        for earlier, other in enumerate(specs):
            if (other.cron, other.timezone, other.params) == (
                spec.cron,
                spec.timezone,
                spec.params,
            ):
                raise _error(
                    source,
                    table,
                    f"{key}[{index}]",
                    f"is the same schedule as {key}[{earlier}] (same cron, timezone and params)",
                )
        specs.append(spec)
    return tuple(specs)


def validate_schedule(
    raw: Any,
    source: str = MANIFEST_FILE,
    table: str | None = None,
    key: str = "schedule",
    *,
    default_overlap: str = MANIFEST_OVERLAP,
) -> ScheduleSpec:
    """Validate one entry `{cron, timezone, misfire, overlap, params}`; errors name
    `key.<field>`."""
    if not isinstance(raw, Mapping):
        raise _error(source, table, key, f"must be a table, not {_show(raw)}")
    for name in raw:
        if name not in SCHEDULE_KEYS:
            raise _error(
                source,
                table,
                f"{key}.{name}",
                f"unknown key (allowed: {', '.join(SCHEDULE_KEYS)})",
                field=str(name),
            )
    place = (source, table, key)
    return ScheduleSpec(
        cron=_cron(place, raw.get("cron")),
        timezone=_timezone(place, raw.get("timezone")),
        misfire=_misfire(place, raw.get("misfire", SKIP)),
        params=_params(place, raw.get("params", {})),
        overlap=_overlap(place, raw.get("overlap", default_overlap)),
    )


_Place = tuple[str, str | None, str]  # source, table, key of the entry


def _field_error(place: _Place, field: str, problem: str, sub: str = "") -> ScheduleSpecError:
    source, table, key = place
    return _error(source, table, f"{key}.{field}{sub}", problem, field=field)


def _cron(place: _Place, raw: Any) -> str:
    if raw is None:
        raise _field_error(place, "cron", 'missing: a schedule needs a cron, e.g. "0 3 * * *"')
    if not isinstance(raw, str):
        raise _field_error(place, "cron", f"must be a string, not {_show(raw)}")
    if not is_storable_text(raw) or len(raw) > MAX_CRON_CHARS:
        raise _field_error(
            place, "cron", f"must be 1-{MAX_CRON_CHARS} characters of text without NUL"
        )
    cron = normalize_cron(raw)
    if cron.startswith("@"):
        raise _field_error(
            place,
            "cron",
            f"macros such as {raw.strip()!r} are not accepted; write the five fields "
            f'({" ".join(CRON_FIELDS)}), e.g. "0 0 * * *" for every day at midnight',
        )
    fields = cron.split()
    if len(fields) != len(CRON_FIELDS):
        raise _field_error(
            place,
            "cron",
            f"{raw!r} has {len(fields)} fields; a cron has exactly five: {' '.join(CRON_FIELDS)}",
        )
    try:
        parse_cron(cron)
    except (CronSimError, ValueError, LookupError) as error:
        raise _field_error(place, "cron", f"{raw!r} is not a valid cron: {error}") from None
    return cron


def _timezone(place: _Place, raw: Any) -> str:
    if raw is None:
        raise _field_error(
            place,
            "timezone",
            'missing: a schedule names its IANA zone, e.g. "UTC" or "Europe/Berlin" '
            "(the host's zone is never assumed)",
        )
    if not isinstance(raw, str) or raw not in zone_names():
        raise _field_error(
            place,
            "timezone",
            f'must be an IANA zone name such as "UTC" or "Europe/Berlin", not {_show(raw)}',
        )
    return raw


def _misfire(place: _Place, raw: Any) -> str:
    if not isinstance(raw, str) or raw not in MISFIRE_POLICIES:
        allowed = " or ".join(repr(policy) for policy in MISFIRE_POLICIES)
        raise _field_error(place, "misfire", f"must be {allowed}, not {_show(raw)}")
    return raw


def _overlap(place: _Place, raw: Any) -> str:
    if not isinstance(raw, str) or raw not in OVERLAP_POLICIES:
        allowed = ", ".join(repr(policy) for policy in OVERLAP_POLICIES)
        raise _field_error(place, "overlap", f"must be one of {allowed}, not {_show(raw)}")
    return raw


def _params(place: _Place, raw: Any) -> tuple[tuple[str, ParamValue], ...]:
    if not isinstance(raw, Mapping):
        raise _field_error(place, "params", f"must be a table of values, not {_show(raw)}")
    for name, value in raw.items():
        sub = f".{name}"
        if not isinstance(name, str) or not PARAM_NAME_PATTERN.fullmatch(name):
            raise _field_error(
                place,
                "params",
                "a parameter name is 1-64 characters of A-Z a-z 0-9 _, not starting with a digit",
                sub,
            )
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
                raise _field_error(place, "params", f"integer {value} is outside ±(2**53 - 1)", sub)
            continue
        if isinstance(value, str):
            if value and not is_storable_text(value):
                raise _field_error(place, "params", "must be UTF-8 text without NUL", sub)
            continue
        raise _field_error(
            place, "params", f"must be a string, an integer or a boolean, not {_show(value)}", sub
        )
    return tuple(sorted(raw.items()))


class ScheduleSpecError(ManifestError):
    """A schedule entry breaks a rule; the message and `source`, `table`, `key` name
    the place as the manifest's errors do, and `field` names the entry's field
    (cron, timezone, misfire, overlap, params) or is None for the entry as a whole."""

    def __init__(
        self, source: str, table: str | None, key: str, field: str | None, problem: str
    ) -> None:
        self.field = field
        where = source + (f": [{table}] {key}" if table is not None else f": {key}")
        super().__init__(f"{where}: {problem}", source=source, table=table, key=key)


def _error(
    source: str, table: str | None, key: str, problem: str, field: str | None = None
) -> ScheduleSpecError:
    return ScheduleSpecError(source, table, key, field, problem)


def _show(value: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a float", str: "a string"}
    kind = kinds.get(type(value))
    if kind is None:
        kind = "a list" if isinstance(value, list) else "a table"
        if not isinstance(value, (list, Mapping)):
            kind = type(value).__name__
    text = repr(value)
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"
