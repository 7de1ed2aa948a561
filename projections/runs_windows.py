"""The candidate index of the Runs read model: `domain.work`'s windows for each Run
folded after a batch (docs/DESIGN.md, "The candidate index")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from domain.aggregate import RunAggregate, fold
from domain.flow import PlanFlow
from domain.records import Record
from domain.slots import (
    attempt_slot,
    holds_until,
    lease_holds_until,
    run_slot_state,
    slot_state_of,
)
from domain.work import grant_windows, phase_windows
from eventstore.api import Reads
from projections.run_streams import read_whole_runs
from projections.runs_fold import (
    _Rows,
)
from projections.runs_schema import _LEASE, _RUN, _STEPS, GRANT_COLUMNS, WINDOW_COLUMNS, Row

# --- the candidate index: the domain's answer for the folded Run ------------------------


def _refresh_work(rows: _Rows, aggregate: RunAggregate) -> None:
    """Store `domain.work`'s windows for the Run and its Attempts held in `rows`."""
    run = rows.runs.get(aggregate.run_id)
    if run is None:
        return
    for phase, window in phase_windows(aggregate).items():
        run[f"{phase}_opens_ms"] = None if window is None else window.opens_ms
        run[f"{phase}_closes_ms"] = None if window is None else window.closes_ms
    flow = aggregate.plan.flow
    run["priority"] = flow.priority
    run["run_slot"] = None if flow.run_slot is None else flow.run_slot.slot
    run["slot_state"] = run_slot_state(aggregate)
    grants = grant_windows(aggregate)
    admitted_at_ms = aggregate.run.admitted_at_ms
    for attempt_id, state in aggregate.attempts.items():
        attempt = rows.attempts.get(attempt_id)
        if attempt is not None:
            window = grants.get(attempt_id)
            attempt["grant_opens_ms"] = None if window is None else window.opens_ms
            attempt["grant_closes_ms"] = None if window is None else window.closes_ms
            # the lease order (domain.slots.lease_order) and the slot a lease takes
            attempt["priority"] = flow.priority
            attempt["run_admitted_ms"] = admitted_at_ms
            ref = attempt_slot(aggregate, attempt_id)
            attempt["slot"] = None if ref is None else ref.slot
            attempt["slot_until_ms"] = None if ref is None else holds_until(state)


def _refresh_at_rest(run: Row, attempts: Iterable[Row], flow: PlanFlow) -> None:
    """`_refresh_work` for a Run the domain says is at rest (`domain.work.at_rest` of
    its status: no work in any phase, no Attempt grantable), without its aggregate:
    the same columns from its rows as folded and its plan's flow (`flow`)."""
    for column in WINDOW_COLUMNS:
        run[column] = None
    run["priority"] = flow.priority
    run["run_slot"] = None if flow.run_slot is None else flow.run_slot.slot
    run["slot_state"] = slot_state_of(flow, True, False)
    admitted_at_ms = run["admitted_at_ms"]
    for attempt in attempts:
        for column in GRANT_COLUMNS:
            attempt[column] = None
        attempt["priority"] = flow.priority
        attempt["run_admitted_ms"] = admitted_at_ms
        ref = flow.step_slot(attempt["step_key"])
        attempt["slot"] = None if ref is None else ref.slot
        attempt["slot_until_ms"] = (
            None
            if ref is None
            else lease_holds_until(attempt["lease_status"], attempt["expires_at_ms"])
        )


def _after(
    tx: Reads,
    records: Sequence[Record],
    rows: _Rows,
    touched: set[str],
    folded: Mapping[str, RunAggregate] | None,
) -> list[RunAggregate]:
    """The touched Runs after these records: the writer's aggregate where it has the
    Run exactly as these records leave it, else folded by the domain from the Run's
    streams as this transaction reads them (the records are in the log)."""
    wanted = {run_id for run_id in touched if run_id in rows.runs}
    found = []
    if folded:
        for run_id, streams in _by_run(records, rows).items():
            aggregate = folded.get(run_id)
            if run_id in wanted and aggregate is not None and _ends_at(aggregate, streams):
                found.append(aggregate)
                wanted.discard(run_id)
    return found + _folded_runs(tx, wanted)


def _by_run(records: Sequence[Record], rows: _Rows) -> dict[str, _Streams]:
    """The records grouped by Run into (run, steps, {attempt: lease}) streams, in
    log order (a lease record's Run is its Attempt's, as held in `rows`)."""
    by_run: dict[str, _Streams] = {}
    for record in records:
        family, _, entity_id = record.stream_id.partition("-")
        if family == _LEASE:
            attempt = rows.attempts.get(entity_id)
            if attempt is None:
                continue
            streams = by_run.setdefault(attempt["run_id"], ([], [], {}))
            streams[2].setdefault(entity_id, []).append(record)
        elif family in (_RUN, _STEPS):
            streams = by_run.setdefault(entity_id, ([], [], {}))
            (streams[0] if family == _RUN else streams[1]).append(record)
    return by_run


def _ends_at(aggregate: RunAggregate, streams: _Streams) -> bool:
    """Whether each stream's records end at the aggregate's version of it."""
    run_records, step_records, lease_records = streams
    if run_records and run_records[-1].stream_version != aggregate.version:
        return False
    if step_records and step_records[-1].stream_version != aggregate.steps_version:
        return False
    return all(
        found[-1].stream_version == aggregate.lease_versions.get(attempt_id, 0)
        for attempt_id, found in lease_records.items()
    )


def _folded_runs(tx: Reads, run_ids: Iterable[str]) -> list[RunAggregate]:
    """Each Run's aggregate, folded by the domain from its streams as `tx` reads them."""
    return [fold(*streams) for streams in read_whole_runs(tx, run_ids).values()]


_Streams = tuple[list[Record], list[Record], dict[str, list[Record]]]
