"""A Run's folded aggregate as a JSON document, and back (docs/DESIGN.md, "Snapshots").

`snapshot_document(aggregate)` holds every field of the aggregate and the versions
it was folded at (the Run stream, the StepRun stream, each lease stream);
`aggregate_from_snapshot(document)` reads it back strictly: a document that does not
check raises CorruptionError. A snapshot is only a shortcut: the fold resumed from
it (`domain.aggregate.extend`) must equal the fold of the whole log, which `verify`
proves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any

import orjson

from domain.errors import CorruptionError
from domain.plan import plan_to_dict
from domain.plan_record import is_int, plan_from_data, plan_order
from domain.records import Record
from domain.run_state import AttemptState, LeaseState, RunAggregate, RunState, StepRunState

SNAPSHOT_SCHEMA = "qlflow.run-snapshot.v1"
_RUN_FIELDS = tuple(f.name for f in fields(RunState) if f.name != "plan")
_STEP_FIELDS = tuple(f.name for f in fields(StepRunState))
_ATTEMPT_FIELDS = tuple(f.name for f in fields(AttemptState))
_LEASE_FIELDS = tuple(f.name for f in fields(LeaseState))
_DOCUMENT_FIELDS = (
    "schema", "run", "steps", "attempts", "steps_version", "lease_versions", "digest",
)  # fmt: skip
_NAME_SETS = {
    names: frozenset(names)
    for names in (
        (*_RUN_FIELDS, "plan"),
        _STEP_FIELDS,
        _ATTEMPT_FIELDS,
        _LEASE_FIELDS,
        _DOCUMENT_FIELDS,
    )
}
_TUPLES = {"needs", "attempt_ids", "lease_ids"}


def snapshot_document(aggregate: RunAggregate) -> dict[str, Any]:
    """The aggregate as a JSON-able dict, with the versions it was folded at."""
    run = aggregate.run
    document = {
        "schema": SNAPSHOT_SCHEMA,
        "run": {
            **{name: getattr(run, name) for name in _RUN_FIELDS},
            "plan": plan_to_dict(run.plan),
        },
        "steps": [_plain(step, _STEP_FIELDS) for step in aggregate.steps.values()],
        "attempts": [_attempt(attempt) for attempt in aggregate.attempts.values()],
        "steps_version": aggregate.steps_version,
        "lease_versions": dict(aggregate.lease_versions),
    }
    return {**document, "digest": _digest(document)}


def _digest(document: Mapping[str, Any]) -> str:
    """SHA-256 over the sorted-key JSON of the document without its digest: an edit
    to a stored snapshot that does not recompute it is refused on read."""
    body = {key: value for key, value in document.items() if key != "digest"}
    return "sha256:" + hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def snapshot_versions(document: Mapping[str, Any]) -> tuple[int, int, dict[str, int]]:
    """(Run stream version, StepRun stream version, {attempt id: lease version}) of a
    document that `aggregate_from_snapshot` accepted."""
    return document["run"]["version"], document["steps_version"], dict(document["lease_versions"])


def aggregate_from_snapshot(document: Any) -> RunAggregate:
    """Read a snapshot document back; CorruptionError if it does not check."""
    try:
        return _read(document)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptionError(f"run snapshot: malformed document: {error!r}") from None


def _read(document: Any) -> RunAggregate:
    if type(document) is not dict or document.get("schema") != SNAPSHOT_SCHEMA:
        raise CorruptionError("run snapshot: not a document of schema " + SNAPSHOT_SCHEMA)
    _exact(
        document,
        ("schema", "run", "steps", "attempts", "steps_version", "lease_versions", "digest"),
    )
    if document["digest"] != _digest(document):
        raise CorruptionError("run snapshot: its digest does not match its content")
    raw_run = document["run"]
    if "queued" not in raw_run:  # written before flow control: no Run was queued
        raw_run = {**raw_run, "queued": False}
    _exact(raw_run, (*_RUN_FIELDS, "plan"))
    where = Record("", f"snapshot-{raw_run['run_id']}", raw_run["version"], 0, "snapshot", {}, {})
    plan = plan_from_data(raw_run["plan"], where)
    run = RunState(**{name: raw_run[name] for name in _RUN_FIELDS}, plan=plan)
    if run.run_id != plan.run_id:
        raise CorruptionError(f"run snapshot of {run.run_id!r} holds the plan of {plan.run_id!r}")
    steps = {}
    for raw in document["steps"]:
        _exact(raw, _STEP_FIELDS)
        values: dict[str, Any] = {k: tuple(v) if k in _TUPLES else v for k, v in raw.items()}
        step = StepRunState(**values)
        steps[step.key] = step
    if list(steps) != sorted(step.key for step in plan.steps):
        raise CorruptionError(f"run snapshot of {run.run_id!r}: StepRuns differ from the plan")
    attempts = {}
    for raw in document["attempts"]:
        attempt = _read_attempt(raw)
        if attempt.step_key not in steps:
            raise CorruptionError(f"run snapshot of {run.run_id!r}: Attempt of no StepRun")
        attempts[attempt.attempt_id] = attempt
    lease_versions = dict(document["lease_versions"])
    versions = [run.version, document["steps_version"], *lease_versions.values()]
    if not all(is_int(v) and v >= 0 for v in versions) or run.version < 1:
        raise CorruptionError(f"run snapshot of {run.run_id!r}: a version is not a count")
    if not set(lease_versions) <= set(attempts):
        raise CorruptionError(f"run snapshot of {run.run_id!r}: lease of an unknown Attempt")
    return RunAggregate(
        run=run,
        steps=MappingProxyType(steps),
        attempts=MappingProxyType(attempts),
        steps_version=document["steps_version"],
        lease_versions=MappingProxyType(lease_versions),
        topo_order=plan_order(plan, where),
    )


def _read_attempt(raw: Any) -> AttemptState:
    if type(raw) is dict and "started_at_ms" not in raw:  # written before step timeouts
        raw = {**raw, "started_at_ms": None}
    _exact(raw, _ATTEMPT_FIELDS)
    values: dict[str, Any] = {k: tuple(v) if k in _TUPLES else v for k, v in raw.items()}
    if values["lease"] is not None:
        _exact(values["lease"], _LEASE_FIELDS)
        values["lease"] = LeaseState(**values["lease"])
    if type(values["admission"]) is not dict:
        raise CorruptionError("run snapshot: an Attempt's admission is not an object")
    return AttemptState(**values)


def _plain(state: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: _json(getattr(state, name)) for name in names}


def _attempt(attempt: AttemptState) -> dict[str, Any]:
    document = _plain(attempt, _ATTEMPT_FIELDS)
    if attempt.lease is not None:
        document["lease"] = _plain(attempt.lease, _LEASE_FIELDS)
    return document


def _json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _json(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_json(item) for item in value]
    return value


def _exact(value: Any, names: tuple[str, ...]) -> None:
    # a stored document is decoded JSON: its objects are dicts (and this runs per
    # StepRun and Attempt of every load, so no ABC checks)
    if type(value) is not dict or value.keys() != _NAME_SETS[names]:
        raise CorruptionError(f"run snapshot: expected the fields {sorted(names)}")
