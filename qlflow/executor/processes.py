"""Step processes on this host: spawned in their own session, signalled as a group,
and killed by the kernel if the worker dies first."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path


def _parent_death_signal() -> Callable[[], None] | None:
    """On Linux, a function for the child (between fork and exec) that asks the
    kernel to SIGKILL it when the thread that spawned it dies — so even a worker
    killed with SIGKILL, which runs no cleanup, leaves no step process behind.
    None elsewhere. The C function is looked up here, in the parent: the child
    only makes one system call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def die_with_parent() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return die_with_parent


_DIE_WITH_PARENT = _parent_death_signal()


def spawn(argv: tuple[str, ...], cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start `argv` in `cwd` as the leader of a new session, stdin closed, stdout and
    stderr on pipes of their own (read by `capture.LogCapture`)."""
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_DIE_WITH_PARENT,
    )


def signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Send `signum` to the process and everything it spawned."""
    # The child leads its own session, so its pid is the group id; signalling the
    # group reaches whatever it spawned too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def signal_name(exit_code: int | None) -> str | None:
    """The name of the signal that ended a process (a negative exit code), or None."""
    if exit_code is None or exit_code >= 0:
        return None
    return signal.Signals(-exit_code).name
