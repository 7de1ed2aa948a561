"""A retention policy a host runs by itself (docs/DESIGN.md, "Retention"): after a
cycle, at most one bounded batch of Runs that finished longer ago than
`finished_runs_ms` (every cycle while batches come full, else every
RETAIN_EVERY_MS), the space they held reclaimed at most every RECLAIM_EVERY_MS, and
now and then the step logs last written longer ago than `logs_ms`, so a cycle's time
stays flat however much is old.

Read from a host config's `[retention]` table (`finished_runs = "30d"`, `logs =
"7d"`) or given as `qlflow serve --retain-finished 30d --retain-logs 7d`.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.retention import RetentionReport
from domain import retention
from domain.errors import InvalidInput
from qlflow.runtime import Runtime

log = logging.getLogger("qlflow")

LOG_PRUNE_EVERY_MS = 600_000  # step logs are pruned at most this often
# a batch of Runs at most this often while the last one was not full: one retention
# record then names a few minutes' Runs, not one each (a record and its index rows
# cost about as much as a Run's tombstone); a full batch means a backlog, and the
# next tick takes the next batch at once
RETAIN_EVERY_MS = 600_000
# after a batch removed Runs, the store's freed space is reclaimed at most this often
# (Runtime.reclaim: VACUUM on PostgreSQL): what autovacuum leaves dead until a fifth
# of a table is, an hour's removals at most stay unusable
RECLAIM_EVERY_MS = 3_600_000
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


@dataclass(slots=True)
class RetentionPolicy:
    """What a host removes by itself, and when it last pruned logs."""

    finished_runs_ms: int | None = None
    logs_ms: int | None = None
    batch: int = retention.DEFAULT_BATCH
    on_removed: Callable[[list[str]], object] | None = None  # the Runs a batch removed
    reclaim_every_ms: int | None = RECLAIM_EVERY_MS  # None: autovacuum's alone
    reclaimed_at: int | None = None  # when the store last reclaimed removed Runs' space
    _logs_pruned_at: int | None = None
    _retained_at: int | None = None  # when the last batch was not full
    _unreclaimed: bool = False  # Runs removed since the last reclaim

    def __post_init__(self) -> None:
        for name in ("finished_runs_ms", "logs_ms", "reclaim_every_ms"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise InvalidInput(name, "age", f"{name} must be an age above zero, got {value!r}")
        retention.check_batch(self.batch)

    @property
    def active(self) -> bool:
        return self.finished_runs_ms is not None or self.logs_ms is not None

    def tick(self, rt: Runtime, now_ms: int) -> RetentionReport | None:
        """One bounded step of the policy at `now_ms`: at most one batch of Runs (none
        within RETAIN_EVERY_MS of a batch that was not full: None)."""
        report = None
        due = self._retained_at is None or now_ms - self._retained_at >= RETAIN_EVERY_MS
        if self.finished_runs_ms is not None and now_ms > self.finished_runs_ms and due:
            report = rt.retain(
                now_ms - self.finished_runs_ms, batch=self.batch, max_batches=1, now_ms=now_ms
            )
            self._retained_at = None if report.runs >= self.batch else now_ms
            if report.runs:
                log.info("retention removed %d run(s), %d event(s)", report.runs, report.events)
                self._unreclaimed = True
                if self.on_removed is not None:
                    self.on_removed(report.run_ids)
        every = self.reclaim_every_ms
        if (
            every is not None
            and self._unreclaimed
            and (self.reclaimed_at is None or now_ms - self.reclaimed_at >= every)
        ):
            rt.reclaim()
            self.reclaimed_at, self._unreclaimed = now_ms, False
        if self.logs_ms is not None and now_ms > self.logs_ms:
            due = (
                self._logs_pruned_at is None or now_ms - self._logs_pruned_at >= LOG_PRUNE_EVERY_MS
            )
            if due:
                rt.prune_logs(now_ms - self.logs_ms)
                self._logs_pruned_at = now_ms
        return report


def parse_age(field: str, text: object) -> int:
    """An age such as "30d", "12h", "1h30m" in ms; InvalidInput for anything else or zero."""
    if not isinstance(text, str):
        raise InvalidInput(field, "age", f'{field} must be an age such as "30d", got {text!r}')
    value, total, number = text.strip().lower(), 0, ""
    index = 0
    while index < len(value):
        char = value[index]
        if char.isdigit():
            number += char
            index += 1
            continue
        unit = "ms" if value.startswith("ms", index) else char
        if not number or unit not in _UNITS_MS:
            raise InvalidInput(field, "age", f'{field} must be an age such as "30d", got {text!r}')
        total += int(number) * _UNITS_MS[unit]
        number, index = "", index + len(unit)
    if number or total <= 0:
        raise InvalidInput(
            field, "age", f'{field} must be an age above zero such as "30d", got {text!r}'
        )
    return total


def from_table(table: Mapping[str, Any]) -> RetentionPolicy:
    """The policy a `[retention]` table names (finished_runs, logs, batch)."""
    known = {"finished_runs", "logs", "batch"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise InvalidInput("retention", "keys", f"[retention] knows {sorted(known)}, not {unknown}")
    finished = table.get("finished_runs")
    logs = table.get("logs")
    return RetentionPolicy(
        finished_runs_ms=None if finished is None else parse_age("finished_runs", finished),
        logs_ms=None if logs is None else parse_age("logs", logs),
        batch=table.get("batch", retention.DEFAULT_BATCH),
    )


def from_config(path: Path) -> RetentionPolicy:
    """The `[retention]` table of a host config file (TOML); none: an empty policy."""
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise InvalidInput("config", "toml", f"cannot read host config {path}: {error}") from None
    table = document.get("retention", {})
    if not isinstance(table, dict):
        raise InvalidInput("config", "retention", "[retention] must be a table")
    return from_table(table)
