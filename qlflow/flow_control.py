"""The Runtime's calls about flow control (docs/DESIGN.md "Flow control"): the
limits with their slots in use and who holds them, and changing a limit at runtime."""

from __future__ import annotations

from actors import limits
from actors.authority import OperationAuthority
from actors.limits import LimitChange
from domain.flow import parse_target
from eventstore import BaseStore
from projections import limits as limit_rows
from projections.limits import LimitView
from qlflow.arguments import instant, optional_text, text


class FlowControl:
    """Mixed into `Runtime`: what it needs is its store and its authority."""

    store: BaseStore
    _authority: OperationAuthority

    def _now(self, now_ms: int | None) -> int:
        """`now_ms` as given (checked), or the store's time as last seen."""
        return self.store.clock_ms() if now_ms is None else instant("now_ms", now_ms)

    def limits(self, now_ms: int | None = None) -> list[LimitView]:
        """Every concurrency limit the packages declare (their newest publications), and
        every key value of
        a keyed one in use, waited for or set: its limit in force (declared, or set
        with `set_limit`), the slots in use at `now_ms` and who holds them (Attempts
        under their leases, Runs of a limited Workflow), and what waits for one."""
        now = self._now(now_ms)
        declared = limit_rows.declared_limits(self.store)
        return limit_rows.list_limits(self.store, declared, now)

    def set_limit(
        self, target: str, limit: int, *, by: str | None = None, now_ms: int | None = None
    ) -> LimitChange:
        """Change a declared limit at runtime, in force from the next lease (or
        queue turn): `target` is `task:<package>/<task>`,
        `workflow:<package>/<workflow>`, or one key value of a keyed limit
        (`task:etl/fetch[eu]`); `limit` 1..10,000. Recorded as `limit.set` with
        `by` (who), the time, the old and the new value. InvalidInput, nothing
        written, for a limit out of range or a target its package does not declare."""
        target = text("target", target)
        set_by = optional_text("by", by) or "api"
        now = self._now(now_ms)
        package = parse_target(target).package
        declared = limit_rows.declared_limits(self.store, [package])
        return limits.set_limit(self._authority, target, limit, set_by, now, declared)
