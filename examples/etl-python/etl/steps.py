"""The steps of the etl-python example: each takes a qlflow.TaskContext and returns
a JSON object, which the steps that need it receive in `ctx.needs`."""

from __future__ import annotations

from typing import Any


def extract(ctx: Any) -> dict[str, Any]:
    """A flaky source: the first Attempt of every Run fails; the retry succeeds."""
    if ctx.attempt == 1:
        ctx.log.warning(
            "the source is not answering (attempt %d of %d)", ctx.attempt, ctx.max_attempts
        )
        raise ConnectionError("source unavailable")
    rows = [{"id": i, "amount": i * 10} for i in range(ctx.params["rows"])]
    ctx.log.info("extracted %d rows", len(rows))
    return {"rows": rows}


def transform(ctx: Any) -> dict[str, Any]:
    """Totals extract's rows."""
    rows = ctx.needs["extract"]["rows"]
    return {"count": len(rows), "total": sum(row["amount"] for row in rows)}


async def load(ctx: Any) -> dict[str, Any]:
    """Loads the totals (an `async def` is awaited)."""
    summary = ctx.needs["transform"]
    ctx.log.info("loading %s", summary)
    return {"loaded": summary["count"], "run": ctx.run_id}
