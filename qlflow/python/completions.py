"""Completions of steps that end together, recorded in one commit (a group commit):
the first step to arrive writes what is waiting with `complete_many`; steps that
end while it writes are written together next. A step alone costs what `complete`
costs; four that end at once cost one commit, not four (docs/DESIGN.md, "Python
tasks")."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.errors import InvalidInput
from qlflow.runtime import Completed, Completion, Lease, Runtime


@dataclass
class _Waiting:
    completion: Completion
    answer: Completed | None = None
    error: BaseException | None = None
    done: bool = False


class GroupCompletions:
    """`complete(...)` as `Runtime.complete` answers it, batched with whatever other
    threads complete at the same time."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._lock = threading.Condition()
        self._queue: list[_Waiting] = []
        self._writing = False

    def complete(
        self,
        lease: Lease,
        outcome: str,
        *,
        result_code: str | None = None,
        output: dict[str, Any] | None = None,
        execution: Mapping[str, Any] | None = None,
    ) -> str:
        """Record the outcome; returns the recorded status, or raises what `complete`
        would (a FenceError for this lease, a transient store error for the batch)."""
        waiting = _Waiting(
            Completion(lease, outcome, result_code=result_code, output=output, execution=execution)
        )
        with self._lock:
            self._queue.append(waiting)
            while not waiting.done and self._writing:
                self._lock.wait()
            if waiting.done:
                return _answer(waiting)
            self._writing = True
            batch, self._queue = self._queue, []
        try:
            self._write(batch)
        finally:
            with self._lock:
                self._writing = False
                self._lock.notify_all()
        return _answer(waiting)

    def _write(self, batch: list[_Waiting]) -> None:
        try:
            answers = self._rt.complete_many([w.completion for w in batch])
        except InvalidInput as error:
            if len(batch) == 1:
                batch[0].error, batch[0].done = error, True
                return
            # one bad completion refuses the whole call: record the others alone
            for waiting in batch:
                self._write([waiting])
            return
        except BaseException as error:
            for waiting in batch:
                waiting.error, waiting.done = error, True
            return
        for waiting, answer in zip(batch, answers, strict=True):
            waiting.answer, waiting.done = answer, True


def _answer(waiting: _Waiting) -> str:
    if waiting.error is not None:
        raise waiting.error
    assert waiting.answer is not None
    if waiting.answer.error is not None:
        raise waiting.answer.error
    assert waiting.answer.status is not None
    return waiting.answer.status
