"""One executor for a host that runs both kinds of Task: each leased Attempt goes to
the python executor when its Task names a function, else to the command executor."""

from __future__ import annotations

import logging

from domain.errors import QlflowError
from qlflow.executor.local import LocalProcessExecutor
from qlflow.executor.reports import AttemptReport, RunningProcess
from qlflow.executor.seam import Completer
from qlflow.executor.tasks import PublishedTasks
from qlflow.python.executor import PythonExecutor
from qlflow.runtime import Lease

log = logging.getLogger("qlflow.executor")


class TaskRouter:
    """The executor seam over a command executor and a python executor."""

    def __init__(
        self, tasks: PublishedTasks, commands: LocalProcessExecutor, python: PythonExecutor
    ) -> None:
        self.tasks = tasks
        self.commands = commands
        self.python = python

    @property
    def completer(self) -> Completer | None:
        """How both executors record an outcome (None: `Runtime.complete`)."""
        return self.python.completer

    @completer.setter
    def completer(self, completer: Completer | None) -> None:
        self.commands.completer = completer
        self.python.completer = completer

    @property
    def kill_after_s(self) -> float:
        """The longer of the two executors' grace."""
        return max(self.commands.kill_after_s, self.python.kill_after_s)

    def execute(self, lease: Lease) -> AttemptReport:
        """Run `lease`'s Attempt on the executor of its Task's kind. A Task that cannot
        be found goes to the command executor, which records why it cannot start."""
        try:
            python = self.tasks.runs_python(lease)
        except QlflowError as error:
            log.debug("attempt %s: task kind unknown: %s", lease.attempt_id, error)
            python = False
        return (self.python if python else self.commands).execute(lease)

    def running(self) -> list[RunningProcess]:
        """What runs on either executor."""
        return [*self.commands.running(), *self.python.running()]

    def renew_now(self, run_id: str | None = None) -> None:
        """Renew the leases of both now."""
        self.commands.renew_now(run_id)
        self.python.renew_now(run_id)

    def stop_all(self, reason: str = "shutdown") -> None:
        """Stop the steps of both."""
        self.commands.stop_all(reason)
        self.python.stop_all(reason)

    def kill_all(self) -> None:
        """Kill the steps of both."""
        self.commands.kill_all()
        self.python.kill_all()

    def close(self) -> None:
        """Close both. Idempotent."""
        self.commands.close()
        self.python.close()
