"""Named fault-injection points for crash and response-loss tests.

Write paths call `hit("<operation>.<point>")` at each commit point: before BEGIN,
after BEGIN, after each append (`hit_append()`), before COMMIT, after COMMIT. The
operation is the unit of work's name (`publish`, `admission`, `recovery`,
`cancellation`, `frontier`, `lease`, `start`, `running`, `renew`, `complete`,
`cancel`, ...).

Nothing happens unless a test enables it, either in-process (`arm`, `watch`,
`enable_counting`) or, for a child process, with the environment variable

    QLFLOW_FAULT=<name>[@<n>]=<action>     e.g. complete.before_commit@2=kill
    QLFLOW_FAULT=count                      count hits only

When nothing is enabled, `hit` is one truthiness check of a module global.

Actions: `raise` (raise `InjectedFault`, once), `kill` (SIGKILL this process at
once), or a callable run at the point. With `@<n>` (or `arm(..., nth=n)`) the
action fires only at the n-th hit of that point, counted from when it was armed.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

ENVIRONMENT_VARIABLE = "QLFLOW_FAULT"
Action = str | Callable[[], None]


class InjectedFault(RuntimeError):
    """Raised at an armed fault point with action `raise`."""


@dataclass(slots=True)
class _Armed:
    action: Action
    nth: int | None


_active = False  # anything armed, watched or counted: the only check on the hot path
_armed: dict[str, _Armed] = {}
_counts: dict[str, int] = {}
_watchers: list[Callable[[str], None]] = []
_lock = threading.Lock()
_open_unit = threading.local()  # the unit of work whose transaction is open on this thread


def hit(name: str) -> None:
    """Mark a fault point; act only if a test enabled fault injection."""
    if not _active:
        return
    _track_unit(name)
    with _lock:
        seen = _counts[name] = _counts.get(name, 0) + 1
        armed = _armed.get(name)
        watchers = tuple(_watchers)
    for watcher in watchers:
        watcher(name)
    if armed is None or (armed.nth is not None and armed.nth != seen):
        return
    if callable(armed.action):
        armed.action()
    elif armed.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif armed.action == "raise":
        with _lock:
            _armed.pop(name, None)  # fire once: the retry must get through
        raise InjectedFault(f"injected fault at {name}")


def hit_append() -> None:
    """Mark `<unit>.after_append` for the unit of work open on this thread.

    Called by the write path after each append (with its read models updated), so a
    unit with two appends has two hits of its `after_append` point.
    """
    if not _active:
        return
    hit(f"{current_unit() or 'unit'}.after_append")


def current_unit() -> str | None:
    """The unit of work whose transaction is open on this thread (tracked only while
    fault injection is enabled): the operation of the last `<unit>.after_begin` hit."""
    return getattr(_open_unit, "name", None)


def _track_unit(name: str) -> None:
    unit, _, point = name.rpartition(".")
    if point == "after_begin":
        _open_unit.name = unit
    elif point in ("before_begin", "after_commit"):
        _open_unit.name = None


def arm(name: str, action: Action = "raise", *, nth: int | None = None) -> None:
    """Arm one point (at its `nth` hit only, if given). Also counts every hit."""
    global _active
    if not (callable(action) or action in ("raise", "kill")):
        raise ValueError(f"fault action must be 'raise', 'kill' or a callable, got {action!r}")
    if nth is not None and (isinstance(nth, bool) or not isinstance(nth, int) or nth < 1):
        raise ValueError(f"nth must be a positive int, got {nth!r}")
    with _lock:
        _armed[name] = _Armed(action, nth)
        _counts.pop(name, None)  # `nth` counts from now
        _active = True


def watch(watcher: Callable[[str], None]) -> None:
    """Call `watcher(name)` at every hit of every point (e.g. to time transactions)."""
    global _active
    with _lock:
        _watchers.append(watcher)
        _active = True


def enable_counting() -> None:
    """Count hits of every point without arming any (see `counts`)."""
    global _active
    with _lock:
        _active = True


def disarm() -> None:
    """Clear every armed point, watcher and hit count: fault injection is off again."""
    global _active
    with _lock:
        _armed.clear()
        _counts.clear()
        _watchers.clear()
        _active = False
    _open_unit.name = None


def counts() -> dict[str, int]:
    """How often each point was hit while fault injection was enabled."""
    with _lock:
        return dict(_counts)


def parse_spec(spec: str) -> tuple[str, int | None, str] | None:
    """Parse `<name>[@<n>]=<action>` into (name, n, action); `count` or '' -> None.

    Raises ValueError for anything else, so a mistyped setting never silently
    disables the fault a test relies on.
    """
    spec = spec.strip()
    if spec in ("", "count"):
        return None
    target, separator, action = spec.partition("=")
    action = action.strip()
    if not separator or action not in ("raise", "kill"):
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be '<name>[@<n>]=raise|kill', got {spec!r}")
    name, at, nth_text = target.strip().partition("@")
    if not name or (at and not nth_text.isdigit()) or (at and int(nth_text) < 1):
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: bad point {target!r} in {spec!r}")
    return name, int(nth_text) if at else None, action


def _arm_from_environment() -> None:
    spec = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if spec.strip() == "count":
        enable_counting()
        return
    parsed = parse_spec(spec)
    if parsed is not None:
        name, nth, action = parsed
        arm(name, action, nth=nth)


_arm_from_environment()
