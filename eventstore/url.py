"""Store URLs: `sqlite:///relative.db`, `sqlite:////abs/path.db`, `postgresql://...`
(or `postgres://...`). SQLite options may ride in the query string
(`?synchronous=NORMAL&busy_timeout_ms=2000`); a PostgreSQL URL goes to libpq as is."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from domain.errors import InvalidInput

SQLITE = "sqlite"  # the embedded store: one database file
POSTGRESQL = "postgresql"  # the server store: many replicas on one database
SQLITE_URL_OPTIONS = ("synchronous", "busy_timeout_ms")


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """A parsed store URL."""

    kind: str  # SQLITE | POSTGRESQL
    target: str  # SQLite: file path; PostgreSQL: the conninfo URL
    options: dict[str, str] = field(default_factory=dict)


def store_kind(url: str) -> str:
    """Which store a URL names, by its scheme: SQLITE or POSTGRESQL (InvalidInput for
    anything else). Only the scheme is read; `parse_store_url` checks the rest."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidInput(
            "url",
            "format",
            f"a store URL looks like sqlite:///path.db or postgresql://..., got {url!r}",
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return POSTGRESQL
    if scheme != "sqlite":
        raise InvalidInput(
            "url",
            "scheme",
            f"unknown store URL scheme {scheme!r}: use sqlite:///path.db or postgresql://...",
        )
    return SQLITE


def database_file(url: str) -> str | None:
    """The database file a URL names (SQLite), or None for a database server."""
    parsed = parse_store_url(url)
    return parsed.target if parsed.kind == SQLITE else None


def parse_store_url(url: str) -> StoreUrl:
    """Split a store URL into kind, target and URL-borne options (InvalidInput if bad)."""
    if store_kind(url) == POSTGRESQL:
        return StoreUrl(POSTGRESQL, url)
    parts = urlsplit(url)
    if parts.netloc:
        raise InvalidInput(
            "url",
            "format",
            "a SQLite URL has no host: write sqlite:///relative.db or sqlite:////abs.db, "
            f"got {url!r}",
        )
    path = parts.path[1:]  # "/rel.db" -> "rel.db", "//abs.db" -> "/abs.db"
    if not path:
        raise InvalidInput("url", "path", f"the SQLite URL names no database file: {url!r}")
    if path == ":memory:":
        raise InvalidInput(
            "url", "path", "an in-memory SQLite database is not durable; name a file"
        )
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InvalidInput(
            "url", "path", f"directory {directory!r} of the SQLite file does not exist"
        )
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - set(SQLITE_URL_OPTIONS))
    if unknown:
        raise InvalidInput(
            "url",
            "option",
            f"unknown SQLite URL option(s) {unknown}; known: {list(SQLITE_URL_OPTIONS)}",
        )
    return StoreUrl(SQLITE, path, options)


def with_search_path(url: str, schema: str) -> str:
    """A PostgreSQL URL whose connections use `schema` first (libpq `options`), so the
    store creates and reads its tables there."""
    parts = urlsplit(url)
    query = [(key, value) for key, value in parse_qsl(parts.query) if key != "options"]
    existing = dict(parse_qsl(parts.query)).get("options", "")
    options = f"{existing} -c search_path={schema}".strip()
    query.append(("options", options))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
