"""Audit queries over the event log: a Run's timeline, a Step's history, the
aggregate at any version, why a Run is (not) terminal, and a tail of new events.

Everything here reads the log, never the read models, and folds with the domain's
own `fold`, so an answer can be checked against the records it cites. Reads take
the store's head position first and ignore anything after it: positions are
assigned in commit order (both adapters), so the streams read one by one still form
one consistent state — the log as it was at that position.

One module per question: `run_log` (reading a Run's streams), `timeline` and
`summaries` (its records as sentences), `at_version`, `why` with `why_report`,
`root_cause` and `failures`, and `follow`.
"""

from projections.audit.at_version import aggregate_at
from projections.audit.follow import follow
from projections.audit.root_cause import root_cause
from projections.audit.run_log import RunLog, read_run_log
from projections.audit.summaries import summarize
from projections.audit.timeline import TimelineEntry, step_history, timeline
from projections.audit.why import why
from projections.audit.why_report import (
    AttemptBlock,
    Intent,
    RootCause,
    StepFailure,
    StepWait,
    WhyReport,
)

__all__ = [
    "AttemptBlock",
    "Intent",
    "RootCause",
    "RunLog",
    "StepFailure",
    "StepWait",
    "TimelineEntry",
    "WhyReport",
    "aggregate_at",
    "follow",
    "read_run_log",
    "root_cause",
    "step_history",
    "summarize",
    "timeline",
    "why",
]
