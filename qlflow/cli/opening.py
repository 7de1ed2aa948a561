"""Opening the runtime on `--db` for one command, and printing a store URL safely."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import typer

from domain.errors import NotFound, QlflowError, StoreUnavailable
from qlflow.cli.app import settings
from qlflow.cli.exits import EXIT_UNAVAILABLE, CliError
from qlflow.cli.logs import last_warning_of
from qlflow.runtime import Runtime


def redact(url: str) -> str:
    """A store URL fit to print: a PostgreSQL password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, at, host = rest.rpartition("@")
    user, colon, _password = credentials.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}{at}{host}"


@contextlib.contextmanager
def opened(ctx: typer.Context, *, read_only: bool = False) -> Iterator[Runtime]:
    """The runtime on `--db`; a database that cannot be opened is one clear error.
    `read_only` (the read commands): the store must exist and is never created,
    converted, migrated or locked for writing."""
    import qlflow

    chosen = settings(ctx)
    url = chosen.url
    options: dict[str, Any] = {"read_only": read_only}
    if chosen.connect_timeout_s is not None and url.startswith(("postgresql:", "postgres:")):
        options["connect_timeout_s"] = chosen.connect_timeout_s
    # The connection pool logs every failed attempt; keep the last one as the reason
    # instead of letting each print (and the final error say only "timed out").
    with last_warning_of("psycopg.pool") as reason:
        try:
            rt = qlflow.open(url, chosen.profile, **options)
        except StoreUnavailable as error:
            cause = _first_line(reason.message) if error.reason == "unreachable" else None
            raise CliError(
                f"cannot open the database {redact(url)}: {cause or error}", EXIT_UNAVAILABLE
            ) from None
        except NotFound as error:  # a read-only open: it names where it looked
            raise CliError(str(error)) from None
        except QlflowError as error:
            raise CliError(f"--db {redact(url)}: {error}") from None
        except Exception as error:  # sqlite3 / psycopg / OS errors, by driver
            cause = _first_line(reason.message) or str(error).strip() or repr(error)
            raise CliError(
                f"cannot open the database {redact(url)}: {cause.splitlines()[0]}"
            ) from None
    try:
        yield rt
    finally:
        rt.close()


def _first_line(message: str | None) -> str | None:
    """The pool's last warning, without its "error connecting in 'pool'" prefix."""
    if not message:
        return None
    return re.sub(r"^error connecting in '[^']*': ", "", message.strip()).splitlines()[0]
