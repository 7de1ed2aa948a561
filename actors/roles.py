"""Least-privilege PostgreSQL roles for one qlflow schema (Cluster profile).

`setup_roles(admin_url, schema, prefix)` creates (idempotently) five roles named
`<prefix>_<kind>` and returns a connection URL for each login role:

- **owner** owns the schema and every table. It alone runs migrations (connect as
  it to upgrade) and maintenance (`rebuild_projections`, `verify_projections`), and
  it alone may UPDATE or DELETE events: a trigger refuses everyone else, superusers
  included.
- **runtime** runs the cycle and the workers. Row-level security lets it read only
  the runtime's streams (Runs, StepRun mutations, leases, admission receipts,
  schedules); it appends to them only through `qlflow_append` (no INSERT, UPDATE or
  DELETE on events, heads or the position counter), admits only through
  `qlflow_admit` (the start guard in the database), and reads and writes the read
  models of Runs and admission receipts. It cannot read the publications,
  publishers or their events: admission asks `qlflow_admission_source(target)`
  (projections.admission_source), workers `qlflow_published_revisions`.
- **admission** (no login) owns those SECURITY DEFINER functions and may only SELECT
  the publications and publishers tables and the publications' events (and call
  `qlflow_append_core`, from `qlflow_admit`).
- **publisher** (publisher-admin) publishes, withdraws, quarantines, revokes and
  reinstates: it appends to the publication and publisher streams (through
  `qlflow_append`) and writes the publications and publishers tables, and sees
  nothing of the Runs.
- **audit** reads everything, the whole log included, and writes nothing.

This module only puts the declarations together: which role kind may read and
append which stream categories (below), the store's grants on its own tables
(`eventstore.grants.store_grants`), the step logs' `eventstore.logs.GRANTS` (the
runtime writes them, the audit role reads them), each projection module's `GRANTS` and the
projection layer's server-side functions (`registry.functions()`);
`eventstore.pg_roles` applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from domain import streams
from eventstore import logs
from eventstore.grants import (
    ADMISSION,
    AUDIT,
    PUBLISHER,
    RUNTIME,
    LogAccess,
    append_rights,
    store_grants,
)
from eventstore.pg_roles import (
    IDLE_IN_TRANSACTION_MS,
    RoleUrls,
    apply_roles,
    drop_roles,
    role_names,
    role_url,
)
from projections import registry

__all__ = ["LOG_ACCESS", "RoleUrls", "drop_roles", "role_names", "role_url", "setup_roles"]

_RUNTIME_STREAMS = tuple(map(streams.prefix, streams.RUNTIME_CATEGORIES))
_PROVENANCE_STREAMS = tuple(map(streams.prefix, streams.PROVENANCE_CATEGORIES))
LOG_ACCESS = (
    LogAccess(RUNTIME, reads=_RUNTIME_STREAMS, appends=_RUNTIME_STREAMS),
    LogAccess(PUBLISHER, reads=_PROVENANCE_STREAMS, appends=_PROVENANCE_STREAMS),
    # the admission source reads a publication's `publication.published` record
    LogAccess(ADMISSION, reads=(streams.prefix(streams.PUBLICATION),), events_only=True),
    LogAccess(AUDIT, reads=None),
)


def setup_roles(
    admin_url: str,
    schema: str,
    prefix: str,
    *,
    migrate: Callable[[str], None] | None = None,
    passwords: Mapping[str, str] | None = None,
    idle_in_transaction_ms: int = IDLE_IN_TRANSACTION_MS,
) -> RoleUrls:
    """Create or repair the roles of `schema` and return their URLs. Idempotent.

    `admin_url` connects as a superuser. `migrate(owner_url)` is called to bring every
    table up to date as the owner before the grants (qlflow's command line passes one
    that opens the runtime, which migrates every component); without it the tables
    must exist already. `passwords` maps login kinds to passwords to set (and put in
    the URLs); kinds without one keep what the server's authentication expects.
    `idle_in_transaction_ms` bounds how long a session may idle inside a
    transaction (see `eventstore.pg_roles.apply_roles`). Raises InvalidInput for a
    bad name or URL and SchemaError for a table no module declares grants for, or a
    missing one.
    """
    table_grants, policies = store_grants(LOG_ACCESS)
    table_grants.update({table: dict(privileges) for table, privileges in logs.GRANTS.items()})
    for module in registry.modules():
        table_grants.update(
            {table: dict(privileges) for table, privileges in module.GRANTS.items()}
        )
    return apply_roles(
        admin_url,
        schema,
        prefix,
        table_grants=table_grants,
        policies=policies,
        functions=registry.functions(),
        append_rights=append_rights(LOG_ACCESS),
        migrate=migrate,
        passwords=passwords,
        idle_in_transaction_ms=idle_in_transaction_ms,
    )
