"""Deterministic identifiers (SPEC §7): a 4-character prefix and 32 lowercase hex
digits of a domain-separated SHA-256 of the named inputs — 36 characters.

The same inputs always give the same id, so a caller that lost a COMMIT response
recomputes the same records and the store replays them exactly.
"""

from __future__ import annotations

import hashlib
import json

ID_DOMAIN = b"qlflow/deterministic-id@v1\x00"

# SPEC §7 prefixes
ADMISSION_EVENT = "wfe:"
FRONTIER_EVENT = "wff:"
WORKFLOW_TERMINAL = "wft:"
TASK_ATTEMPT = "wta:"
TASK_ATTEMPT_EVENT = "wte:"
CANCEL_ATTEMPT_EVENT = "wca:"
CANCEL_STEP_MUTATION = "wcm:"
CANCEL_STEP_EVENT = "wcs:"
CANCEL_RUN_EVENT = "wcr:"
# prefixes for records the spec leaves unnamed
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
PUBLICATION_EVENT = "wpe:"
PUBLISHER_EVENT = "wpp:"
RUN_ID = "run:"  # run id derived from an admission key when none is given
STEP_RUN_ID = "srn:"

_PREFIXES = {
    value
    for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, str) and len(value) == 4 and value.endswith(":")
}


def derive_id(prefix: str, *parts: str | int | None) -> str:
    """Return `prefix` + 32 hex digits of SHA-256(domain, prefix, parts).

    Parts are encoded as a JSON array so that ("ab", "c") and ("a", "bc") differ.
    """
    if prefix not in _PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    for part in parts:
        if part is not None and not isinstance(part, (str, int)) or isinstance(part, bool):
            raise TypeError(f"id part must be str, int or None, not {type(part).__name__}")
    payload = json.dumps([prefix, *parts], ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(ID_DOMAIN + payload.encode("utf-8")).hexdigest()
    return prefix + digest[:32]
