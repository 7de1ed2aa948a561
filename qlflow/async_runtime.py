"""The same API as `Runtime`, as coroutines. Each call runs on a worker thread
(`asyncio.to_thread`): the runtime's waits are blocking (pykka futures, database
calls), and awaiting them on the loop thread would stall every other task.

Each method is derived from the `Runtime` method of the same name (`_on_a_thread`):
its signature, types and docstring are that method's, so the two cannot drift;
tests/api/test_public_surface.py fails when a `Runtime` method has no coroutine here."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from qlflow.runtime import Runtime

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _on_a_thread(
    method: Callable[Concatenate[Runtime, _P], _R],
) -> Callable[Concatenate[AsyncRuntime, _P], Coroutine[Any, Any, _R]]:
    """A coroutine method running `method` on the wrapped runtime, off the loop."""

    @functools.wraps(method)
    async def on_a_thread(self: AsyncRuntime, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return await asyncio.to_thread(method, self.runtime, *args, **kwargs)

    return on_a_thread


class AsyncRuntime:
    """Async facade over a `Runtime`: `await rt.cycle()`, `await rt.close()`."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @classmethod
    async def open(cls, url: str | None, profile: str | None, **options: Any) -> AsyncRuntime:
        """Open a `Runtime` off the event loop and wrap it."""
        return cls(await asyncio.to_thread(Runtime, url, profile, **options))

    aggregate_at = _on_a_thread(Runtime.aggregate_at)
    append_log = _on_a_thread(Runtime.append_log)
    backfill_schedule = _on_a_thread(Runtime.backfill_schedule)
    cancel = _on_a_thread(Runtime.cancel)
    cancel_many = _on_a_thread(Runtime.cancel_many)
    clock_ms = _on_a_thread(Runtime.clock_ms)
    complete = _on_a_thread(Runtime.complete)
    complete_and_lease = _on_a_thread(Runtime.complete_and_lease)
    complete_many = _on_a_thread(Runtime.complete_many)
    count_runs = _on_a_thread(Runtime.count_runs)
    cycle = _on_a_thread(Runtime.cycle)
    events = _on_a_thread(Runtime.events)
    get_run = _on_a_thread(Runtime.get_run)
    inspect_admission = _on_a_thread(Runtime.inspect_admission)
    last_log_lines = _on_a_thread(Runtime.last_log_lines)
    lease_attempts = _on_a_thread(Runtime.lease_attempts)
    limits = _on_a_thread(Runtime.limits)
    log_attempts = _on_a_thread(Runtime.log_attempts)
    logs = _on_a_thread(Runtime.logs)
    mark_running = _on_a_thread(Runtime.mark_running)
    mark_starting = _on_a_thread(Runtime.mark_starting)
    packages = _on_a_thread(Runtime.packages)
    pause_schedule = _on_a_thread(Runtime.pause_schedule)
    prune_logs = _on_a_thread(Runtime.prune_logs)
    publish = _on_a_thread(Runtime.publish)
    quarantine = _on_a_thread(Runtime.quarantine)
    rebuild_projections = _on_a_thread(Runtime.rebuild_projections)
    renew = _on_a_thread(Runtime.renew)
    rerun = _on_a_thread(Runtime.rerun)
    retain = _on_a_thread(Runtime.retain)
    reclaim = _on_a_thread(Runtime.reclaim)
    resolve_attempt_id = _on_a_thread(Runtime.resolve_attempt_id)
    resolve_run_id = _on_a_thread(Runtime.resolve_run_id)
    resume_schedule = _on_a_thread(Runtime.resume_schedule)
    revoke_publisher = _on_a_thread(Runtime.revoke_publisher)
    runs = _on_a_thread(Runtime.runs)
    schedules = _on_a_thread(Runtime.schedules)
    set_limit = _on_a_thread(Runtime.set_limit)
    short_run_ids = _on_a_thread(Runtime.short_run_ids)
    start = _on_a_thread(Runtime.start)
    step_history = _on_a_thread(Runtime.step_history)
    task_definition = _on_a_thread(Runtime.task_definition)
    task_inputs = _on_a_thread(Runtime.task_inputs)
    timeline = _on_a_thread(Runtime.timeline)
    verify_projections = _on_a_thread(Runtime.verify_projections)
    why = _on_a_thread(Runtime.why)
    withdraw = _on_a_thread(Runtime.withdraw)
    workflow_params = _on_a_thread(Runtime.workflow_params)
    workers = _on_a_thread(Runtime.workers)
    close = _on_a_thread(Runtime.close)

    async def __aenter__(self) -> AsyncRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
