"""A rerun: a new Run admitted from a finished one (docs/DESIGN.md "Reruns").

`rerun` reads the source Run, fixes the admission key once (the caller's, else
`rerun:<source>:<n>` for the first n no rerun of the source holds yet) and admits
through `actors.admission` -- so exact replay, the start guard and the single commit
are admission's -- with the source's reused steps (`domain.rerun`) in that commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.admission import REPLAY_ONCE, Rerun, _admit, admission_identity, receipt_of_key
from actors.authority import Units
from actors.loading import RunStreams, read_run_streams
from domain.errors import AdmissionCollision, InvalidInput, NotFound
from domain.rerun import PLAN_SAME, check_mode, check_rerunnable, is_rerun_of
from domain.run_state import RunAggregate
from domain.streams import run_stream
from domain.values import AdmissionReceipt
from eventstore.api import Reads, Transaction
from projections import retention as retained

RERUN_KEY = "rerun"  # the default admission key of a rerun: rerun:<source run>:<n>
MAX_RERUNS = 10_000  # reruns of one Run the default key counts


def rerun_key(source_run_id: str, n: int) -> str:
    """The default admission key of the n-th rerun (1-based) of a Run."""
    return f"{RERUN_KEY}:{source_run_id}:{n}"


def next_rerun_key(reader: Reads, source_run_id: str) -> str:
    """The default key of the next rerun of `source_run_id`: the first n whose key
    admitted nothing yet."""
    for n in range(1, MAX_RERUNS + 1):
        key = rerun_key(source_run_id, n)
        if receipt_of_key(reader, key) is None:
            return key
    raise InvalidInput("run_id", "reruns", f"run {source_run_id!r} has {MAX_RERUNS} reruns")


def rerun(
    authority: Units,
    run_id: str,
    *,
    from_steps: Sequence[str] | None = None,
    plan: str = PLAN_SAME,
    admission_key: str | None = None,
    params: Mapping[str, Any] | None = None,
    reason: str | None = None,
    now_ms: int,
) -> AdmissionReceipt:
    """Admit a rerun of `run_id` (see the module docstring); retried once as `start`
    is, under the same key, so a lost COMMIT response never makes two Runs."""
    mode = check_mode(plan)
    steps = None if from_steps is None else _step_keys(from_steps)
    if mode == PLAN_SAME and params:
        raise InvalidInput(
            "params",
            "same_plan",
            "a rerun of the same plan binds its parameters; use plan='head' (--head)",
        )
    if admission_key is None:
        admission_key = authority.read(lambda tx: _default_key(tx, run_id))
    admission_key, new_run_id = admission_identity(admission_key, None)

    def unit(tx: Transaction) -> tuple[AdmissionReceipt, RunAggregate | None]:
        try:
            source = _locked_source(tx, run_id)
        except NotFound:
            # the key wins over a source retention removed, as over one still here
            return _answer_of_key(tx, run_id, admission_key, mode), None
        check_rerunnable(source)
        source_plan = source.plan
        bound = dict(source_plan.param_values)
        bound.update(params or {})
        request = Rerun(
            source=source,
            from_steps=steps,
            same_plan=mode == PLAN_SAME,
            rerun_of={
                "run_id": run_id,
                "reason": reason or _reason(steps),
                "plan": mode,
            },
        )
        return _admit(
            tx,
            source_plan.publication_id if mode == PLAN_SAME else source_plan.installation,
            source_plan.workflow_key,
            admission_key,
            new_run_id,
            source_plan.timeout_ms,
            now_ms,
            bound or None,
            authority.workflows,
            request,
        )

    receipt, admitted = REPLAY_ONCE.execute(authority, unit, "rerun")
    if admitted is not None:
        authority.aggregates.put([admitted])
    return receipt


def _locked_source(tx: Transaction, run_id: str) -> RunAggregate:
    """The source Run, read under its Run stream's head lock: retention removes a Run
    only under that lock and asks the domain again there, so a rerun admitted
    concurrently either commits first (and retention, seeing it running, keeps its
    source) or waits and finds the source gone (docs/DESIGN.md, "Retention")."""
    tx.lock_heads([run_stream(run_id)], wait=True)
    return _source(tx, run_id).fold()


def _answer_of_key(tx: Reads, run_id: str, admission_key: str, mode: str) -> AdmissionReceipt:
    """The answer to a rerun of `run_id`, which is not in the store, under a key: the
    key's Run ("existing") when it is a rerun of that source, which retention removed
    after admitting it (docs/DESIGN.md, "Retention"). No plan can be made again
    without the source, so what is compared is the key's Run's `rerun_of` record (or,
    when retention removed that Run too, the Workflow both tombstones name); a key
    that admitted something else is an AdmissionCollision, and one that admitted
    nothing leaves the source's NotFound."""
    missing = retained.run_not_found(tx, run_id)
    receipt = receipt_of_key(tx, admission_key)
    if receipt is None:
        raise missing
    records = tx.read_stream(run_stream(receipt.run_id), after_version=0)
    if records:
        same = is_rerun_of(records[0].data.get("rerun_of"), run_id, mode)
    else:  # both removed: the source's tombstone names its Workflow, if it kept a receipt
        source = retained.removed_receipt(tx, run_id=run_id)
        same = source is not None and (source.package, source.workflow_key) == (
            receipt.package,
            receipt.workflow_key,
        )
    if not same:
        raise AdmissionCollision(
            f"admission key {admission_key!r} already admitted run {receipt.run_id!r}, "
            f"which is not a rerun of run {run_id!r} ({missing}). Use a new admission key, "
            "or inspect_admission(admission_key=...) to read the admitted Run"
        )
    return receipt


def _source(tx: Reads, run_id: str) -> RunStreams:
    """The source Run's streams; NotFound saying so when retention removed it."""
    try:
        return read_run_streams(tx, run_id)
    except NotFound:
        raise retained.run_not_found(tx, run_id) from None


def _default_key(tx: Reads, run_id: str) -> str:
    _source(tx, run_id)  # NotFound for an unknown Run, before a key is made
    return next_rerun_key(tx, run_id)


def _reason(steps: tuple[str, ...] | None) -> str:
    if steps is None:
        return "rerun of the steps that did not succeed"
    return f"rerun from {', '.join(steps)}"


def _step_keys(from_steps: Sequence[str]) -> tuple[str, ...]:
    if isinstance(from_steps, str) or not all(isinstance(s, str) and s for s in from_steps):
        raise InvalidInput("from_steps", "type", "from_steps must be a list of step keys")
    return tuple(dict.fromkeys(from_steps))
