"""Retention's rules (docs/DESIGN.md, "Retention"): which Runs may be removed, the
record that names what a batch removed, and the proof that the log's gaps are
exactly what those records name.

Pure: the caller reads the Runs, their reruns and their stored events, and gets
back the decision and the record to append.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain import ids, streams
from domain.canonical import digest_of_canonical
from domain.errors import InvalidInput
from domain.event_types import EventType
from domain.records import NewEvent, StreamAppend
from domain.transitions import RUN_TERMINAL

DIGEST_DOMAIN = "qlflow/retention-events@v1"
MAX_BATCH = 1000  # Runs one retention transaction removes at most
DEFAULT_BATCH = 100
REMOVED = EventType.RETENTION_REMOVED

Range = tuple[int, int]  # first and last global position, both removed


@dataclass(frozen=True, slots=True)
class Candidate:
    """A Run as the read model holds it, and the statuses of the Runs that rerun it."""

    run_id: str
    status: str
    terminal_at_ms: int | None
    rerun_statuses: tuple[str, ...] = ()


def check_cutoff(finished_before_ms: object, now_ms: int) -> int:
    """`finished_before_ms` as epoch ms, refused (InvalidInput) when it is not an
    instant after the epoch or lies in the future of `now_ms`."""
    if (
        isinstance(finished_before_ms, bool)
        or not isinstance(finished_before_ms, int)
        or finished_before_ms <= 0
    ):
        raise InvalidInput(
            "finished_before_ms",
            "instant",
            f"finished_before_ms must be epoch ms after 0, got {finished_before_ms!r}",
        )
    if finished_before_ms > now_ms:
        raise InvalidInput(
            "finished_before_ms",
            "future",
            f"finished_before_ms {finished_before_ms} is in the future (now is {now_ms}): "
            "retention removes only Runs that finished before a past time",
        )
    return finished_before_ms


def check_batch(batch: object) -> int:
    """The number of Runs a batch removes, 1..MAX_BATCH (else InvalidInput)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise InvalidInput(
            "batch", "range", f"batch must be an int in 1..{MAX_BATCH}, got {batch!r}"
        )
    return batch


def refusal(candidate: Candidate, finished_before_ms: int) -> str | None:
    """Why `candidate` may not be removed, or None: it must be terminal, have finished
    before the cutoff, and no Run that reruns it may still be running (its fold
    reads the source's outputs)."""
    if candidate.status not in RUN_TERMINAL or candidate.terminal_at_ms is None:
        return f"run {candidate.run_id} is {candidate.status}, not finished"
    if candidate.terminal_at_ms >= finished_before_ms:
        return f"run {candidate.run_id} finished at {candidate.terminal_at_ms}, not before"
    running = [s for s in candidate.rerun_statuses if s not in RUN_TERMINAL]
    if running:
        return f"run {candidate.run_id} is the source of a rerun that is {running[0]}"
    return None


def removable(candidates: Iterable[Candidate], finished_before_ms: int) -> list[str]:
    """The run ids of the candidates retention may remove, in the order given."""
    return [c.run_id for c in candidates if refusal(c, finished_before_ms) is None]


def terminal_statuses() -> tuple[str, ...]:
    """The statuses a removable Run has (for the caller's query), sorted."""
    return tuple(sorted(RUN_TERMINAL))


def ranges(positions: Iterable[int]) -> list[Range]:
    """Sorted positions as the fewest inclusive ranges: 1,2,3,7 -> [(1, 3), (7, 7)]."""
    found: list[list[int]] = []
    for position in sorted(positions):
        if found and position == found[-1][1] + 1:
            found[-1][1] = position
        else:
            found.append([position, position])
    return [(a, b) for a, b in found]


def events_digest(rows: Sequence[Sequence[Any]]) -> str:
    """The digest of removed events: each stored row (position, event id, stream,
    version, type, data text, metadata text) in position order, one JSON array a
    line, so an archive's copy can be checked against the record."""
    hasher_input = bytearray()
    for row in sorted(rows, key=lambda r: r[0]):
        position, event_id, stream, version, type_, data, metadata = row
        hasher_input += _line([position, event_id, stream, version, type_, data, metadata])
    return digest_of_canonical(DIGEST_DOMAIN, bytes(hasher_input))


def _line(values: list[Any]) -> bytes:
    return json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


# What a removed Run's tombstone keeps of its admission receipt (its key's receipt
# stream goes with the Run): every field but the steps, so the key still answers
# "existing" with the same Run and exact replay still compares the plan digest.
RECEIPT_FIELDS = (
    "plan_digest",
    "receipt_digest",
    "package",
    "installation",
    "workflow_key",
    "publication_id",
    "publication_digest",
    "admitted_event_id",
    "final_run_version",
    "final_steps_version",
    "admitted_at_ms",
)


def kept_receipt(document: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fields of a receipt document a tombstone keeps (None when one is missing)."""
    if not all(name in document for name in RECEIPT_FIELDS):
        return None
    return {name: document[name] for name in RECEIPT_FIELDS}


@dataclass(frozen=True, slots=True)
class RemovedRun:
    """One removed Run as its retention record names it."""

    run_id: str
    status: str
    admission_key: str | None
    terminal_at_ms: int | None
    last_version: int  # the Run stream's last version
    steps_version: int  # the StepRun stream's last version
    receipt: Mapping[str, Any] | None = None  # `kept_receipt`: its receipt stream went too

    def document(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "run_id": self.run_id,
            "status": self.status,
            "admission_key": self.admission_key,
            "terminal_at_ms": self.terminal_at_ms,
            "last_version": self.last_version,
            "steps_version": self.steps_version,
        }
        if self.receipt is not None:  # as a list in RECEIPT_FIELDS order: a record names
            found["receipt"] = [self.receipt[name] for name in RECEIPT_FIELDS]  # many Runs
        return found


# A record names its Runs as a table (docs/EVENTS.md, `retention-runs`): the field
# names once (`run_fields`), a row of values per Run, and the receipts' publication
# fields, which every Run of one Workflow and publication shares, once per distinct
# value (`sources`, a row's `source` its index; null: no receipt kept). A record outlives
# its Runs, so its size is most of what a removed Run leaves: about 250 bytes per Run
# less than a document per Run, which records before this format hold (both read).
SOURCE_FIELDS = ("package", "installation", "workflow_key", "publication_id", "publication_digest")
RUN_ROW_FIELDS = (
    "run_id",
    "status",
    "admission_key",
    "terminal_at_ms",
    "last_version",
    "steps_version",
    "source",
    *(name for name in RECEIPT_FIELDS if name not in SOURCE_FIELDS),
)


def _run_row(run: RemovedRun, sources: list[list[Any]]) -> list[Any]:
    """`run` as a row of RUN_ROW_FIELDS, its receipt's source added to `sources`."""
    values: dict[str, Any] = {**run.document(), "source": None}
    if run.receipt is not None:
        source = [run.receipt[name] for name in SOURCE_FIELDS]
        if source not in sources:
            sources.append(source)
        values["source"] = sources.index(source)
        values.update(run.receipt)
    return [values.get(name) for name in RUN_ROW_FIELDS]


def removed_runs(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Runs a retention record's `data` names, each as `RemovedRun.document` gives
    it, from either format (a row table, or a document per Run); what is malformed
    is left out."""
    runs = data.get("runs")
    if not isinstance(runs, list):
        return []
    fields, sources = data.get("run_fields"), data.get("sources")
    if not isinstance(fields, list):  # the format before the table: a document per Run
        return [run for run in runs if isinstance(run, dict) and isinstance(run.get("run_id"), str)]
    found = []
    for row in runs:
        if not isinstance(row, list) or len(row) != len(fields):
            continue
        named = dict(zip(fields, row, strict=True))
        if not isinstance(named.get("run_id"), str):
            continue
        source = named.pop("source", None)
        own = {name: named.pop(name, None) for name in RECEIPT_FIELDS if name not in SOURCE_FIELDS}
        if (
            isinstance(source, int)
            and not isinstance(source, bool)
            and isinstance(sources, list)
            and 0 <= source < len(sources)
            and isinstance(sources[source], list)
            and len(sources[source]) == len(SOURCE_FIELDS)
        ):
            kept = {**own, **dict(zip(SOURCE_FIELDS, sources[source], strict=True))}
            named["receipt"] = [kept[name] for name in RECEIPT_FIELDS]
        found.append(named)
    return found


def receipt_of(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The receipt fields a retention record's Run keeps (`RemovedRun.document`), by
    name, or None when it keeps none (its receipt stream stayed) or they are malformed."""
    kept = run.get("receipt")
    if not isinstance(kept, (list, tuple)) or len(kept) != len(RECEIPT_FIELDS):
        return None
    return dict(zip(RECEIPT_FIELDS, kept, strict=True))


def record(
    expected_version: int,
    runs: Sequence[RemovedRun],
    rows: Sequence[Sequence[Any]],
    removed_at_ms: int,
    archive_digest: str | None = None,
) -> StreamAppend:
    """The retention record of one batch: the Runs, their last versions, the global
    positions of the removed events as ranges, their count and digest (and the
    archive's digest where one was written), appended at `expected_version` + 1."""
    positions = ranges(row[0] for row in rows)
    digest = events_digest(rows)
    sources: list[list[Any]] = []
    data: dict[str, Any] = {
        "run_fields": list(RUN_ROW_FIELDS),
        "runs": [_run_row(run, sources) for run in runs],
        "sources": sources,
        "positions": [list(r) for r in positions],
        "events": len(rows),
        "digest": digest,
        "removed_at_ms": removed_at_ms,
    }
    if archive_digest is not None:
        data["archive_digest"] = archive_digest
    event_id = ids.derive_id(ids.RETENTION_EVENT, expected_version + 1, digest)
    event = NewEvent(event_id, REMOVED, data, {"at_ms": removed_at_ms, "actor": "retention"})
    return StreamAppend(streams.retention_stream(), expected_version, (event,))


def removed_ranges(data: Mapping[str, Any]) -> list[Range]:
    """The position ranges a retention record's data names (malformed: none)."""
    found = []
    for item in data.get("positions") or ():
        if (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            and 0 < item[0] <= item[1]
        ):
            found.append((item[0], item[1]))
    return found


def uncovered(gaps: Sequence[Range], covered: Sequence[Range]) -> tuple[list[Range], list[Range]]:
    """(gaps no record covers, ranges records name that are not gaps): both empty when
    the log's missing positions are exactly what the retention records name."""
    gap_ranges, named = _merged(gaps), _merged(covered)
    if gap_ranges == named:
        return [], []
    return _subtract(gap_ranges, named), _subtract(named, gap_ranges)


def _merged(spans: Iterable[Range]) -> list[Range]:
    found: list[list[int]] = []
    for first, last in sorted(spans):
        if found and first <= found[-1][1] + 1:
            found[-1][1] = max(found[-1][1], last)
        else:
            found.append([first, last])
    return [(a, b) for a, b in found]


def _subtract(spans: list[Range], minus: list[Range]) -> list[Range]:
    """The positions of merged `spans` outside merged `minus`, as ranges."""
    left: list[Range] = []
    j = 0
    for first, last in spans:
        start = first
        while j < len(minus) and minus[j][1] < start:
            j += 1
        k = j
        while k < len(minus) and minus[k][0] <= last:
            if minus[k][0] > start:
                left.append((start, minus[k][0] - 1))
            start = max(start, minus[k][1] + 1)
            k += 1
        if start <= last:
            left.append((start, last))
    return left
