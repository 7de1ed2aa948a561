"""qlflow: durable DAG workflows as event-sourced aggregates on SQLite or PostgreSQL.

    import qlflow
    rt = qlflow.open()                      # ./qlflow.db, or $QLFLOW_DB
    rt.publish("examples/nightly")
    receipt = rt.start("backup", "nightly")
    rt.cycle()                              # the host calls this on its own cadence

See SPEC §10 for the whole API; `qlflow.errors` holds the typed errors.
"""

from __future__ import annotations

from typing import Any

from qlflow import errors
from qlflow.async_runtime import AsyncRuntime
from qlflow.runtime import Lease, Runtime

__all__ = ["AsyncRuntime", "Lease", "Runtime", "errors", "open", "open_async"]


def open(url: str | None = None, profile: str | None = None, **options: Any) -> Runtime:
    """Open a runtime on `url` (`sqlite:///path.db` or `postgresql://...`; default
    `$QLFLOW_DB`, else `./qlflow.db`). `profile`: edge | standalone | cluster
    (default: standalone on SQLite, cluster on PostgreSQL)."""
    return Runtime(url, profile, **options)


async def open_async(
    url: str | None = None, profile: str | None = None, **options: Any
) -> AsyncRuntime:
    """Like `open`, but every method is a coroutine that never blocks the event loop."""
    return await AsyncRuntime.open(url, profile, **options)
