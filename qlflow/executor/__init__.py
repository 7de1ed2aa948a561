"""The `local_process` executor: one subprocess per leased Attempt.

Per Attempt, in this order:
1. find the Task's command in the Run's published revision and the package folder
   it runs in (`PublishedTasks`, in `tasks`), and check the folder still holds the
   files the Task's source digest covers;
2. `mark_starting` — the start barrier, durable before anything is spawned;
3. spawn the command in the package folder, in its own process group, with
   `QLFLOW_RUN_ID`, `QLFLOW_STEP_KEY`, `QLFLOW_ATTEMPT_ID` and the Task's env set,
   stdout and stderr read from pipes into the Attempt's log in the store about once
   a second (capped: head and tail) and, whole, into a log file on this host
   (`capture`);
4. `mark_running`, then renew the lease every ttl/3 while the process runs; when a
   renewal answers `stop_requested` (or the host stops the worker) the group gets
   SIGTERM, and SIGKILL once `kill_after_s` has passed (`local`);
5. store the rest of the log, then `complete` with exit code 0 -> `succeeded`,
   anything else -> `failed`, and
   `output = {"log_path", "exit_code", "pid", ...}`.
A command that cannot be found or started completes `failed` with result code
`start_failed` and the error in the output (`task_file_refused` when a file it
names fails the package checks: outside the folder, not a regular file, too large);
a folder whose files no longer give the source digest completes `failed` with
`source_changed`; a step the host stops on its way out (the drain ran out) completes `failed` with
`worker_shutdown`. A store that cannot take a write right now is retried while the
lease is renewed; only a lost lease stops the worker's claim. No process outlives its Attempt: the
group is killed after the leader exits, on loss of the lease, and on `close()`.
Why a lease fences every write: docs/DESIGN.md, "Fencing".
"""

from domain.transitions import WORKER_SHUTDOWN
from qlflow.executor.local import (
    DEFAULT_KILL_AFTER_S,
    DEFAULT_TTL_MS,
    START_FAILED,
    LocalProcessExecutor,
)
from qlflow.executor.reports import AttemptReport, RunningProcess
from qlflow.executor.tasks import (
    SOURCE_CHANGED,
    TASK_FILE_REFUSED,
    PublishedTasks,
    TaskCommand,
    TaskUnavailable,
)

__all__ = [
    "DEFAULT_KILL_AFTER_S",
    "DEFAULT_TTL_MS",
    "START_FAILED",
    "SOURCE_CHANGED",
    "TASK_FILE_REFUSED",
    "WORKER_SHUTDOWN",
    "AttemptReport",
    "LocalProcessExecutor",
    "PublishedTasks",
    "RunningProcess",
    "TaskCommand",
    "TaskUnavailable",
]
