"""The W3C trace context of a Run, derived from its ids (docs/DESIGN.md,
"Observability"): no OpenTelemetry import, so a command and a Python Task get their
`TRACEPARENT` whether or not this host has the otel extra.

A Run's trace id derives from its run id, so every host that makes spans of the
Run — and every command or Python Task it ran — names the same trace, however often
the hosts restarted. The span ids handed to an Attempt derive from its attempt id.
"""

from __future__ import annotations

import functools
import hashlib

TRACEPARENT_ENV = "TRACEPARENT"
_DOMAIN = b"qlflow.trace\0"


def _digest(*parts: str) -> bytes:
    return hashlib.sha256(_DOMAIN + "\0".join(parts).encode()).digest()


@functools.lru_cache(maxsize=1024)  # a Run's spans and its Attempts' TRACEPARENTs ask again
def trace_id(run_id: str) -> int:
    """The 128-bit trace id of a Run (never 0, which W3C forbids)."""
    return int.from_bytes(_digest("run", run_id)[:16]) or 1


def root_span_id(run_id: str) -> int:
    """The 64-bit id of the Run's remote parent: the Run span's parent in its trace."""
    return int.from_bytes(_digest("root", run_id)[:8]) or 1


def attempt_span_id(attempt_id: str) -> int:
    """The 64-bit parent id a command or Python Task of this Attempt is told."""
    return int.from_bytes(_digest("attempt", attempt_id)[:8]) or 1


def traceparent(run_id: str, attempt_id: str) -> str:
    """`00-<trace id>-<parent id>-01`: what an Attempt's process gets as TRACEPARENT."""
    return f"00-{trace_id(run_id):032x}-{attempt_span_id(attempt_id):016x}-01"
