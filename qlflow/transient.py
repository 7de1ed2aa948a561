"""Which errors are worth another try: a busy or unreachable database."""

from __future__ import annotations

import eventstore


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors worth another try: a busy or unreachable database (the store says which)."""
    return eventstore.transient_errors()
