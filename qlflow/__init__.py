"""qlflow: durable DAG workflows as event-sourced aggregates on SQLite or PostgreSQL.

    import qlflow
    rt = qlflow.open()                      # ./qlflow.db, or $QLFLOW_DB
    rt.publish("examples/nightly")
    receipt = rt.start("backup", "nightly")
    rt.cycle()                              # the host calls this on its own cadence

`Runtime` holds the whole API (`AsyncRuntime` the same as coroutines); every value
it returns is importable from here, and `qlflow.errors` holds the typed errors.
docs/DESIGN.md ("Layers") says what lies beneath.
"""

from __future__ import annotations

from typing import Any

from actors.backfill import BackfilledRun, BackfillResult
from actors.limits import LimitChange
from actors.retention import BatchResult, RetentionReport
from actors.supervisor import CycleResult, PageResult
from domain.aggregate import AttemptState, LeaseState, RunAggregate, RunState, StepRunState
from domain.params import ParamDefinition
from domain.records import Record
from domain.values import AdmissionReceipt, Publication
from eventstore.logs import LogState, Pruned
from projections.audit import (
    AttemptBlock,
    Intent,
    RootCause,
    StepFailure,
    StepWait,
    TimelineEntry,
    WhyReport,
)
from projections.limits import LimitView, SlotHolder
from projections.package_views import PackageView
from projections.rebuild import RebuildSummary
from projections.run_search import RunCursor
from projections.schedule_views import ScheduleView
from projections.step_logs import LogAttempt, LogChunk
from projections.task_io import TaskDefinitionView, TaskInputs
from projections.verify import Difference, VerifyReport
from projections.views import AttemptView, RunView, StepView
from projections.workers import WorkerView
from qlflow import errors
from qlflow.async_runtime import AsyncRuntime
from qlflow.executor.reports import AttemptReport
from qlflow.python.context import TaskContext
from qlflow.python.worker import Worker
from qlflow.runtime import Completed, Completion, Lease, Profile, Runtime

__all__ = [
    "BackfillResult",
    "BackfilledRun",
    "TaskDefinitionView",
    "TaskInputs",
    "AdmissionReceipt",
    "AsyncRuntime",
    "AttemptBlock",
    "AttemptReport",
    "AttemptState",
    "AttemptView",
    "Completed",
    "Completion",
    "CycleResult",
    "Difference",
    "Intent",
    "Lease",
    "LeaseState",
    "LimitChange",
    "LimitView",
    "LogAttempt",
    "LogChunk",
    "LogState",
    "PackageView",
    "PageResult",
    "ParamDefinition",
    "Profile",
    "Pruned",
    "Publication",
    "RebuildSummary",
    "RetentionReport",
    "BatchResult",
    "Record",
    "RootCause",
    "RunCursor",
    "RunAggregate",
    "RunState",
    "RunView",
    "Runtime",
    "ScheduleView",
    "SlotHolder",
    "WorkerView",
    "StepRunState",
    "StepFailure",
    "StepView",
    "StepWait",
    "TaskContext",
    "TimelineEntry",
    "VerifyReport",
    "WhyReport",
    "Worker",
    "errors",
    "open",
    "open_async",
]


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
