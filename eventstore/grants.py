"""Who may touch what in a least-privilege PostgreSQL deployment: the vocabulary each
layer declares its own objects' grants in, and the grants of the store's own tables.

Each layer declares for what it owns: the store here (the events, the stream heads,
the position counter and the schema versions, narrowed per stream by row-level
security), each projection module its tables (`GRANTS`) and its server-side
functions (`FUNCTIONS`). A deployment (`actors.roles`) puts them together and
applies them with `eventstore.pg_roles`. Nothing here connects to a database.

Role kinds: **owner** owns the schema and every object (migrations, maintenance, the
only role that may change recorded events); **runtime** runs cycles, workers and
admission; **publisher** publishes and manages publisher trust; **audit** reads
everything and writes nothing; **admission** (no login) owns the SECURITY DEFINER
function through which the runtime asks about publications.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eventstore.locks import LOCK_TABLE
from eventstore.pg_append import RIGHTS_TABLE

OWNER = "owner"
RUNTIME = "runtime"
PUBLISHER = "publisher"
AUDIT = "audit"
ADMISSION = "admission"
LOGIN_KINDS = (OWNER, RUNTIME, PUBLISHER, AUDIT)
KINDS = (*LOGIN_KINDS, ADMISSION)

READ = ("SELECT",)
MOVE = ("SELECT", "INSERT", "UPDATE")

TableGrants = Mapping[str, Mapping[str, tuple[str, ...]]]
"""table -> role kind -> privileges. The owner has everything by owning the tables."""

ROW_SECURITY_TABLES = ("events", "streams")


@dataclass(frozen=True, slots=True)
class LogAccess:
    """What one role kind may do with the event log: read the streams whose ids start
    with one of `reads` (None: every stream), append to (and move the heads of) those
    starting with one of `appends`. `events_only` limits it to reading the events
    table (no stream heads, position counter or schema versions)."""

    kind: str
    reads: tuple[str, ...] | None
    appends: tuple[str, ...] = ()
    events_only: bool = False


@dataclass(frozen=True, slots=True)
class Policy:
    """One row-level security policy: `using` filters the rows a command sees,
    `check` the rows it may write (SQL expressions over the table's columns)."""

    table: str
    name: str
    command: str
    kind: str
    using: str | None
    check: str | None


@dataclass(frozen=True, slots=True)
class ServerFunction:
    """A SECURITY DEFINER function in PL/pgSQL, owned by the role kind `owner` and
    executable by `executors`. `body` is the text between `$body$` marks; `comment`
    marks the version installed, so a caller can refuse an older one."""

    name: str
    parameters: tuple[tuple[str, str], ...]  # (name, type)
    returns: str
    body: str
    owner: str
    executors: tuple[str, ...]
    comment: str

    @property
    def signature(self) -> str:
        """`name(type, ...)`, as `to_regprocedure` and GRANT name it."""
        return f"{self.name}({', '.join(kind for _name, kind in self.parameters)})"


def streams_matching(prefixes: Sequence[str]) -> str:
    """The SQL condition "stream_id starts with one of `prefixes`"."""
    return "(" + " OR ".join(f"starts_with(stream_id, '{p}')" for p in prefixes) + ")"


def store_grants(
    accesses: Sequence[LogAccess],
) -> tuple[dict[str, dict[str, tuple[str, ...]]], tuple[Policy, ...]]:
    """The grants on the store's own tables and the row-level security policies on
    `events` and `streams` that give each role kind its `LogAccess`: reads only. No
    role but the owner may INSERT, UPDATE or DELETE events, stream heads or the
    position counter; appends go through `qlflow_append` (`append_rights`)."""
    tables: dict[str, dict[str, tuple[str, ...]]] = {
        "schema_versions": {},
        "events": {},
        "streams": {},
        "qlflow_position": {},
        RIGHTS_TABLE: {},  # read by the append functions only (as the owner)
        LOCK_TABLE: {},  # row locks: the writing roles only (eventstore.locks)
    }
    policies: list[Policy] = []
    for access in accesses:
        kind = access.kind
        reads = "true" if access.reads is None else streams_matching(access.reads)
        tables["events"][kind] = READ
        policies.append(Policy("events", f"{kind}_reads", "SELECT", kind, reads, None))
        if access.appends or kind == ADMISSION:
            tables[LOCK_TABLE][kind] = ("SELECT", "UPDATE (held)")
        if access.events_only:
            continue
        tables["schema_versions"][kind] = READ
        tables["streams"][kind] = READ
        tables["qlflow_position"][kind] = READ
        policies.append(Policy("streams", f"{kind}_reads", "SELECT", kind, reads, None))
    return tables, tuple(policies)


def append_rights(accesses: Sequence[LogAccess]) -> dict[str, tuple[str, ...]]:
    """The stream prefixes each appending role kind may write through `qlflow_append`
    (the rows of `qlflow_append_rights`); kinds that append nothing are left out."""
    return {access.kind: access.appends for access in accesses if access.appends}
