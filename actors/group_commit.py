"""Group commit: writes that callers on many threads make at the same time share one
transaction (docs/DESIGN.md, "Group commit").

A caller that finds no write in flight writes at once, alone: it pays a lock and
nothing more. Callers that arrive while a write is in flight queue; when it ends,
the first of them writes everything queued (up to `max_batch`) in one call of the
batch function, and each caller gets its own answer. A batch the batch function
refuses whole for a bad argument (InvalidInput) is written again one item at a time,
so only the caller whose item was bad gets the refusal; any other error of a batch
(a transient store error) is every caller's in it, as it would be alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from domain.errors import InvalidInput

Item = TypeVar("Item")
Answer = TypeVar("Answer")


@dataclass(slots=True)
class _Waiting(Generic[Item, Answer]):
    item: Item
    answer: Answer | None = None
    error: BaseException | None = None
    done: bool = False

    def result(self) -> Answer:
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


class GroupCommit(Generic[Item, Answer]):
    """`submit(item)` answers what `write_many([item])[0]` would, sharing the call with
    whatever other threads submit at the same time."""

    def __init__(
        self, write_many: Callable[[Sequence[Item]], Sequence[Answer]], max_batch: int
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._write_many = write_many
        self._max_batch = max_batch
        self._changed = threading.Condition()
        self._queue: list[_Waiting[Item, Answer]] = []
        self._writing = False
        self.batches = 0  # calls of write_many so far (what a bench or a test reads)

    @property
    def queued(self) -> int:
        """Items waiting for a write to end (a test waits on it)."""
        with self._changed:
            return len(self._queue)

    def submit(self, item: Item) -> Answer:
        """Write `item` (with any others that wait) and return its own answer."""
        waiting: _Waiting[Item, Answer] = _Waiting(item)
        with self._changed:
            self._queue.append(waiting)
        while True:
            with self._changed:
                while not waiting.done and self._writing:
                    self._changed.wait()
                if waiting.done:
                    return waiting.result()
                self._writing = True
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
            try:
                self._write(batch)
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()

    def _write(self, batch: list[_Waiting[Item, Answer]]) -> None:
        self.batches += 1
        try:
            answers = self._write_many([waiting.item for waiting in batch])
        except InvalidInput as error:
            if len(batch) == 1:
                batch[0].error, batch[0].done = error, True
                return
            for waiting in batch:  # one bad item refused the call: each alone
                self._write([waiting])
            return
        except BaseException as error:
            for waiting in batch:
                waiting.error, waiting.done = error, True
            return
        for waiting, answer in zip(batch, answers, strict=True):
            waiting.answer, waiting.done = answer, True
