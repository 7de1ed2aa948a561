"""A Run's aggregate as it stood at any version of its run stream, folded from the log."""

from __future__ import annotations

from domain.aggregate import RunAggregate, fold
from domain.errors import InvalidInput
from domain.records import Record
from eventstore.api import EventStore
from projections.audit.run_log import RunLog, read_run_log
from projections.run_streams import claims


def aggregate_at(store: EventStore, run_id: str, version: int | None = None) -> RunAggregate:
    """The Run as it stood while its run stream was at `version` (None: now).

    Folds run records 1..version, the StepRunMutations they caused (run_version <=
    version), and each lease record appended before run record version+1 — so the
    lease changes written with record `version` are in, and so are grants and
    renewals made while the Run stayed at that version. Admission writes versions
    1..n+1 (n steps) in one append, so the first version with a state is n+1."""
    log = read_run_log(store, run_id)
    head = len(log.run)
    first = 1 + len(log.run[0].data["plan"]["steps"])
    if version is None:
        version = head
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= head:
        raise InvalidInput(
            "version",
            "range",
            f"run {run_id!r} has versions 1..{head}; got {version!r}",
        )
    if version < first:
        raise InvalidInput(
            "version",
            "admitted",
            f"run {run_id!r} was admitted at versions 1..{first} in one append; "
            f"its first state is version {first}",
        )
    return fold(*_cut(log, version))


def _cut(
    log: RunLog, version: int
) -> tuple[tuple[Record, ...], list[Record], dict[str, list[Record]]]:
    run = log.run[:version]
    steps = [r for r in log.steps if r.data.get("run_version", 0) <= version]
    before = log.run[version].global_position if version < len(log.run) else log.position + 1
    claimed = {r.data["attempt_id"] for r in claims(run)}
    leases = {
        attempt_id: [r for r in records if r.global_position < before]
        for attempt_id, records in log.leases.items()
        if attempt_id in claimed
    }
    return run, steps, leases
