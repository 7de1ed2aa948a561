"""The same API as `Runtime`, as coroutines. Each call runs on a worker thread
(`asyncio.to_thread`): the runtime's waits are blocking (pykka futures, database
calls), and awaiting them on the loop thread would stall every other task."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from qlflow.runtime import Runtime

_METHODS = frozenset(
    {
        "publish",
        "withdraw",
        "quarantine",
        "revoke_publisher",
        "start",
        "inspect_admission",
        "cancel",
        "cycle",
        "lease_attempts",
        "mark_starting",
        "mark_running",
        "renew",
        "complete",
        "get_run",
        "runs",
        "events",
        "why",
        "rebuild_projections",
        "verify_projections",
        "close",
        "timeline",
        "step_history",
        "aggregate_at",
    }
)


class AsyncRuntime:
    """Async facade over a `Runtime`; `await rt.cycle()`, `await rt.close()`."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @classmethod
    async def open(cls, url: str | None, profile: str | None, **options: Any) -> AsyncRuntime:
        return cls(await asyncio.to_thread(Runtime, url, profile, **options))

    def __getattr__(self, name: str):
        if name not in _METHODS:
            raise AttributeError(name)
        method = getattr(self.runtime, name)

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any):
            return await asyncio.to_thread(method, *args, **kwargs)

        return call

    async def __aenter__(self) -> AsyncRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
