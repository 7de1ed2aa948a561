"""Named fault-injection points for crash and response-loss tests.

Write paths call `hit("<operation>.<point>")` at each commit point (before BEGIN,
after BEGIN, after each append, before COMMIT, after COMMIT). Nothing happens
unless a test arms a point, either in-process with `arm(name, action)` or, for a
child process, with the environment variable `QLFLOW_FAULT=<name>=<action>`.
When nothing is armed, `hit` is one dictionary truthiness check.

Actions: `raise` (raise `InjectedFault`), `kill` (SIGKILL this process at once),
or a callable run at the point.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

_armed: dict[str, str | Callable[[], None]] = {}
_counts: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised at an armed fault point with action `raise`."""


def hit(name: str) -> None:
    """Mark a fault point; act only if a test armed it."""
    if not _armed:
        return
    _counts[name] = _counts.get(name, 0) + 1
    action = _armed.get(name)
    if action is None:
        return
    if callable(action):
        action()
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        _armed.pop(name, None)  # fire once: the retry must get through
        raise InjectedFault(f"injected fault at {name}")


def arm(name: str, action: str | Callable[[], None] = "raise") -> None:
    """Arm one point. Also enables hit counting (see `counts`)."""
    _armed[name] = action


def disarm() -> None:
    """Clear every armed point and the hit counts."""
    _armed.clear()
    _counts.clear()


def counts() -> dict[str, int]:
    """How often each point was hit since arming (only counted while armed)."""
    return dict(_counts)


def _arm_from_environment() -> None:
    spec = os.environ.get("QLFLOW_FAULT", "")
    if "=" in spec:
        name, action = spec.split("=", 1)
        arm(name.strip(), action.strip())


_arm_from_environment()
