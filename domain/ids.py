"""Deterministic identifiers: a 4-character prefix and 32 lowercase hex
digits of a domain-separated SHA-256 of the named inputs — 36 characters.

The same inputs always give the same id, so a caller that lost a COMMIT response
recomputes the same records and the store replays them exactly (docs/DESIGN.md,
"Exact replay").
"""

from __future__ import annotations

import hashlib
import json

ID_DOMAIN = b"qlflow/deterministic-id@v1\x00"

# prefixes of the records a cycle, admission and cancellation write
ADMISSION_EVENT = "wfe:"
FRONTIER_EVENT = "wff:"
WORKFLOW_TERMINAL = "wft:"
TASK_ATTEMPT = "wta:"
TASK_ATTEMPT_EVENT = "wte:"
CANCEL_ATTEMPT_EVENT = "wca:"
CANCEL_STEP_MUTATION = "wcm:"
CANCEL_STEP_EVENT = "wcs:"
CANCEL_RUN_EVENT = "wcr:"
# prefixes of the other records and ids
ADMISSION_MUTATION = "wfm:"  # StepRunMutation written at admission
FRONTIER_MUTATION = "wfn:"  # StepRunMutation written by the frontier
CANCEL_INTENT_EVENT = "wci:"  # workflow.cancel_requested
WORKER_EVENT = "wwe:"  # attempt.starting / running / completion events
WORKER_MUTATION = "wwm:"  # StepRunMutation caused by a worker write
WORKER_STEP_EVENT = "wws:"  # step.* event caused by a worker write
LEASE_EVENT = "wle:"  # lease-<attempt_id> stream events
LEASE_ID = "wls:"  # lease identity
RECOVERY_EVENT = "wre:"  # attempt.lost / step.* written by recovery
RECOVERY_MUTATION = "wrm:"
RECEIPT = "wrr:"  # admission receipt digest-derived id
REVISION_ID = "rev:"
PUBLICATION_ID = "pub:"
PUBLICATION_EVENT = "wpe:"
PUBLISHER_EVENT = "wpp:"
RUN_ID = "run:"  # run id derived from an admission key when none is given
STEP_RUN_ID = "srn:"
SCHEDULE_ID = "sch:"  # a schedule: publisher, package, workflow, cron, zone, params
SCHEDULE_EVENT = "wse:"  # schedule-<id> stream events
RETENTION_EVENT = "wrt:"  # retention-runs stream events
NOTIFICATION_EVENT = "wne:"  # notification-<run_id> outbox events
LIMIT_EVENT = "wlt:"  # limit-<target digest> stream events

_PREFIXES = {
    value
    for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, str) and len(value) == 4 and value.endswith(":")
}


_SEEDED = hashlib.sha256(ID_DOMAIN)
_encode_text = json.encoder.encode_basestring  # exactly what json.dumps(ensure_ascii=False) emits


def _encode_part(part: str | int | None) -> str:
    if part is None:
        return "null"
    if isinstance(part, bool) or not isinstance(part, (str, int)):
        raise TypeError(f"id part must be str, int or None, not {type(part).__name__}")
    return _encode_text(part) if isinstance(part, str) else int.__repr__(part)


def derive_id(prefix: str, *parts: str | int | None) -> str:
    """Return `prefix` + 32 hex digits of SHA-256(domain, prefix, parts).

    Parts are encoded as a compact JSON array (byte-identical to `json.dumps`
    with `ensure_ascii=False`), so ("ab", "c") and ("a", "bc") differ. Decisions
    derive many ids, so the encoding is hand-rolled and the hash pre-seeded.
    """
    if prefix not in _PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    payload = "[" + ",".join([_encode_text(prefix), *map(_encode_part, parts)]) + "]"
    digest = _SEEDED.copy()
    digest.update(payload.encode("utf-8"))
    return prefix + digest.hexdigest()[:32]
