"""How a unit of work is tried again: the one retry policy of the run path, in two
named forms (docs/DESIGN.md "Trying a write again"). A host's pause between cycles in
an outage is the host's (`qlflow.transient.Backoff`), not a unit's.

- `DECIDE_AGAIN`: a worker write, a lease, a cancel. A version conflict means a Run's
  streams moved between the read and the append; the unit reads and decides again, a
  bounded number of times. Nothing else is retried: a refusal is the answer.
- `REPLAY_ONCE`: a Run's admission (a start, a rerun). Any failure that is not a
  refusal (the same key admitted concurrently, a lost COMMIT response, a dropped
  connection) gets one more transaction, whose exact replay returns the durable
  receipt if the first one committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from actors.authority import Units
from domain.errors import VersionConflict
from eventstore.api import Transaction

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Run a unit up to `tries` times while it fails with one of `again_on`; any of
    `never_on` (checked first) or any other error is raised at once."""

    name: str
    tries: int
    again_on: tuple[type[BaseException], ...]
    never_on: tuple[type[BaseException], ...] = ()

    def execute(self, authority: Units, fn: Callable[[Transaction], T], unit: str) -> T:
        """`authority.execute(fn, unit)`, tried again as the policy says."""
        for attempt in range(1, self.tries + 1):
            try:
                return authority.execute(fn, name=unit)
            except self.never_on:
                raise
            except self.again_on:
                if attempt == self.tries:
                    raise
        raise AssertionError("unreachable")


DECIDE_AGAIN = RetryPolicy("decide again", tries=20, again_on=(VersionConflict,))


def replay_once(refusals: tuple[type[BaseException], ...]) -> RetryPolicy:
    """The admission's policy: one more try after anything but one of `refusals`."""
    return RetryPolicy("replay once", tries=2, again_on=(Exception,), never_on=refusals)
