"""Fold a Run's streams into one immutable aggregate, checking the log's integrity.

`fold(run_records, step_records, lease_records)` reads the `run-<id>` RunEvents,
the `steps-<id>` StepRunMutations and each `lease-<attempt_id>` stream
(docs/DESIGN.md, "Streams"; docs/EVENTS.md). Every rule the log must keep is
checked on the way; a record that breaks one raises `CorruptionError` naming the
stream, version and event id:

- versions are contiguous from 1 in every stream, and every record is in its stream;
- the Run stream opens with `workflow.admitted` (carrying the plan), then one
  `step.created` per Step of the plan;
- every status change (Run, StepRun, Attempt, lease) is allowed by
  `domain.transitions`, and a StepRun's epoch grows by exactly 1 per change;
- the k-th StepRunMutation points at the k-th `step.*` RunEvent (same event id,
  run version, StepRun, from, to and epoch): one mutation per event, none extra.

`extend(aggregate, ...)` continues a fold with records appended after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from domain.errors import CorruptionError
from domain.fold_records import MUTATION_TYPE, Folder
from domain.records import Record
from domain.run_state import (
    AttemptState,
    LeaseState,
    RunAggregate,
    RunState,
    StepRunState,
    effective_intent,
)

__all__ = [
    "MUTATION_TYPE", "AttemptState", "LeaseState", "RunAggregate", "RunState",
    "StepRunState", "effective_intent", "extend", "fold",
]  # fmt: skip


def fold(
    run_records: Sequence[Record],
    step_records: Sequence[Record],
    lease_records: Mapping[str, Sequence[Record]] | None = None,
) -> RunAggregate:
    """Fold a Run's streams (each in stream order) into a RunAggregate.

    Raises CorruptionError naming the first record that breaks an integrity rule.
    """
    if not run_records:
        raise CorruptionError("the Run stream is empty: a Run's log opens with workflow.admitted")
    folder = Folder()
    folder.fold(run_records, step_records, lease_records or {})
    return folder.freeze()


def extend(
    aggregate: RunAggregate,
    run_records: Sequence[Record] = (),
    step_records: Sequence[Record] = (),
    lease_records: Mapping[str, Sequence[Record]] | None = None,
) -> RunAggregate:
    """Continue folding `aggregate` with records appended after it (same checks as fold)."""
    folder = Folder.resume(aggregate)
    folder.fold(run_records, step_records, lease_records or {})
    return folder.freeze()
