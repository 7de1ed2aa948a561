"""Least-privilege PostgreSQL roles for one schema: the mechanics.

`apply_roles(admin_url, schema, prefix, table_grants=..., policies=..., functions=...)`
creates (idempotently) a role `<prefix>_<kind>` for every kind of `eventstore.grants`,
hands the schema and every table to the owner, grants exactly what it is given,
replaces the row-level security policies of the event log, installs the given
server-side functions and the append-only trigger on `events`, and returns a
connection URL for each login role. What to grant is declared by each layer for
its own objects (`eventstore.grants.store_grants`, the projection modules' `GRANTS`
and `FUNCTIONS`) and put together by `actors.roles.setup_roles`; this module knows no
table but the store's own.

The append-only trigger refuses UPDATE, DELETE and TRUNCATE on events to every role
but the table's owner, superusers included. A table that the given grants do not
name is a SchemaError, so a new table never ships without a decision on who may
touch it. The admin URL must connect as a superuser (it creates roles and hands
objects to them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from domain.errors import InvalidInput, SchemaError
from eventstore.grants import (
    ADMISSION,
    KINDS,
    LOGIN_KINDS,
    OWNER,
    ROW_SECURITY_TABLES,
    Policy,
    ServerFunction,
    TableGrants,
)
from eventstore.locks import DEFAULT_LOCK_TIMEOUT_MS
from eventstore.pg_append import (
    APPEND_CORE,
    APPEND_FUNCTION,
    APPEND_OR_ABORT,
    BATCH_TYPES,
    CORE_TYPES,
    LOCK_HEADS,
    RIGHTS_TABLE,
)
from eventstore.url import with_search_path

APPEND_ONLY_TRIGGER = "qlflow_events_append_only"

IDLE_IN_TRANSACTION_MS = 30_000  # a session idle inside a transaction this long is cut off
_SETUP_LOCK_KEY = 0x716C666C6F7752  # serialises concurrent role setups
_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_MAX_PREFIX = 40  # leaves room for "_publisher" within PostgreSQL's 63-byte names


# Refuses UPDATE, DELETE and TRUNCATE on events to every role but the table's owner.
_APPEND_ONLY_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $body$
BEGIN
    IF current_user <> (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = TG_RELID)
    THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = format('permission denied: the event log is append-only; %s on %s '
                             'is refused for role %s', TG_OP, TG_TABLE_NAME, current_user),
            HINT = 'only the owner role may change recorded events';
    END IF;
    IF TG_LEVEL = 'STATEMENT' THEN
        RETURN NULL;
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$body$
"""


@dataclass(frozen=True, slots=True)
class RoleUrls:
    """What `apply_roles` made: a URL per login role (search_path set to the schema)
    and the role names by kind (owner, runtime, publisher, audit, admission)."""

    schema: str
    owner: str
    runtime: str
    publisher: str
    audit: str
    roles: Mapping[str, str] = field(default_factory=dict)


def role_names(prefix: str) -> dict[str, str]:
    """The role name of each kind for `prefix` (InvalidInput for a bad prefix)."""
    _check_name("prefix", prefix, _MAX_PREFIX)
    return {kind: f"{prefix}_{kind}" for kind in KINDS}


def apply_roles(
    admin_url: str,
    schema: str,
    prefix: str,
    *,
    table_grants: TableGrants,
    policies: Sequence[Policy],
    functions: Sequence[ServerFunction] = (),
    append_rights: Mapping[str, Sequence[str]] | None = None,
    migrate: Callable[[str], None] | None = None,
    passwords: Mapping[str, str] | None = None,
    idle_in_transaction_ms: int = IDLE_IN_TRANSACTION_MS,
) -> RoleUrls:
    """Create or repair the roles of `schema`, grant `table_grants` (every table of
    the schema must be named there, and every one named must exist), replace the
    event log's row-level security with `policies`, install `functions`, let each
    role kind of `append_rights` append to the streams starting with its prefixes
    through `qlflow_append` (and nothing else), and return the role URLs. Idempotent.

    `admin_url` connects as a superuser. `migrate(owner_url)` is called to bring every
    table up to date as the owner before the grants; without it the tables must exist
    already. `passwords` maps login kinds to passwords to set (and put in the URLs);
    kinds without one keep what the server's authentication expects. Every login
    role gets `lock_timeout` (the store's default) and `idle_in_transaction_session_
    timeout` (`idle_in_transaction_ms`): a session left idle inside a transaction is
    cut off and its locks released. Raises InvalidInput for a bad name or URL and
    SchemaError for a table the grants do not name or a missing one.
    """
    _check_name("schema", schema, 63)
    if type(idle_in_transaction_ms) is not int or idle_in_transaction_ms < 1:
        raise InvalidInput(
            "idle_in_transaction_ms",
            "positive",
            f"idle_in_transaction_ms must be an int >= 1, got {idle_in_transaction_ms!r}",
        )
    names = role_names(prefix)
    passwords = dict(passwords or {})
    unknown = sorted(set(passwords) - set(LOGIN_KINDS))
    if unknown:
        raise InvalidInput(
            "passwords", "kinds", f"passwords for unknown role kinds {unknown}: {LOGIN_KINDS}"
        )
    urls = {kind: role_url(admin_url, names[kind], schema, passwords.get(kind)) for kind in names}
    with _admin(admin_url) as conn:
        _create_roles(conn, names, passwords)
        _own_schema(conn, schema, names)
    if migrate is not None:
        migrate(urls["owner"])
    with _admin(admin_url) as conn:
        tables = _tables(conn, schema)
        _check_tables(tables, schema, table_grants)
        _own_tables(conn, schema, names[OWNER])
        _grant_tables(conn, schema, tables, names, table_grants)
        _row_security(conn, schema, names, policies)
        _append_only_trigger(conn, schema, names[OWNER])
        _append_functions(conn, schema, names, dict(append_rights or {}))
        for function in functions:
            _install_function(conn, schema, names, function)
        settings = {
            "search_path": sql.Identifier(schema),
            # no session may hold what others wait for by waiting or idling itself
            "lock_timeout": sql.Literal(f"{DEFAULT_LOCK_TIMEOUT_MS}ms"),
            "idle_in_transaction_session_timeout": sql.Literal(f"{idle_in_transaction_ms}ms"),
        }
        for kind in LOGIN_KINDS:
            for setting, value in settings.items():
                conn.execute(
                    sql.SQL("ALTER ROLE {} IN DATABASE {} SET {} = {}").format(
                        sql.Identifier(names[kind]),
                        sql.Identifier(conn.info.dbname),
                        sql.Identifier(setting),
                        value,
                    )
                )
    return RoleUrls(
        schema=schema,
        owner=urls["owner"],
        runtime=urls["runtime"],
        publisher=urls["publisher"],
        audit=urls["audit"],
        roles=names,
    )


def drop_roles(admin_url: str, prefix: str) -> None:
    """Drop the roles of `prefix` in the admin URL's database: what they own is handed
    to the admin role first (so the schema and its data stay), their grants and
    policies go. Roles that do not exist are skipped."""
    names = role_names(prefix)
    with _admin(admin_url) as conn:
        existing = [
            name
            for (name,) in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (list(names.values()),)
            ).fetchall()
        ]
        if not existing:
            return
        roles = sql.SQL(", ").join(sql.Identifier(name) for name in existing)
        conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(roles))
        conn.execute(sql.SQL("DROP OWNED BY {}").format(roles))
        conn.execute(sql.SQL("DROP ROLE {}").format(roles))


def role_url(admin_url: str, role: str, schema: str, password: str | None = None) -> str:
    """`admin_url` with its user (and password) replaced and the search_path set."""
    if not isinstance(admin_url, str) or not admin_url.startswith(("postgresql://", "postgres://")):
        raise InvalidInput(
            "admin_url", "format", f"roles need a postgresql:// admin URL, got {admin_url!r}"
        )
    parts = urlsplit(admin_url)
    host = parts.netloc.rpartition("@")[2]
    user = quote(role, safe="")
    if password is not None:
        user += ":" + quote(password, safe="")
    return with_search_path(urlunsplit(parts._replace(netloc=f"{user}@{host}")), schema)


# --- setup steps ---------------------------------------------------------------------


class _admin:
    """One admin transaction: connect, check superuser, commit on success."""

    def __init__(self, admin_url: str) -> None:
        self._url = admin_url

    def __enter__(self) -> psycopg.Connection[Any]:
        self._conn = psycopg.connect(self._url, autocommit=False)
        try:
            superuser = self._conn.execute(
                "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchall()
            if superuser != [(True,)]:
                raise InvalidInput(
                    "admin_url",
                    "superuser",
                    "setting up qlflow roles needs a superuser connection (it creates roles "
                    f"and gives them objects); {self._conn.info.user!r} is not one",
                )
            _lock_setup(self._conn)
        except BaseException:
            self._conn.close()
            raise
        return self._conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None:
                self._conn.commit()
            else:
                self._conn.rollback()
        finally:
            self._conn.close()


def _lock_setup(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SETUP_LOCK_KEY,))


def _create_roles(
    conn: psycopg.Connection[Any], names: Mapping[str, str], passwords: Mapping[str, str]
) -> None:
    for kind, name in names.items():
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
        login = sql.SQL("LOGIN" if kind in LOGIN_KINDS else "NOLOGIN")
        conn.execute(
            sql.SQL(
                "ALTER ROLE {} {} NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
                "NOREPLICATION NOBYPASSRLS"
            ).format(sql.Identifier(name), login)
        )
        if kind in passwords:
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(passwords[kind])
                )
            )


def _own_schema(conn: psycopg.Connection[Any], schema: str, names: Mapping[str, str]) -> None:
    owner = sql.Identifier(names["owner"])
    conn.execute(
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
            sql.Identifier(schema), owner
        )
    )
    conn.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(schema), owner))
    conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(schema)))
    for kind in ("runtime", "admission", "publisher", "audit"):
        conn.execute(
            sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(
                sql.Identifier(schema), sql.Identifier(names[kind])
            )
        )
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(schema), sql.Identifier(names[kind])
            )
        )
    # tables made before the roles existed (say by the admin) become the owner's
    _own_tables(conn, schema, names["owner"])


def _tables(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    rows = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY c.relname""",
        (schema,),
    ).fetchall()
    return [name for (name,) in rows]


def _check_tables(tables: list[str], schema: str, table_grants: TableGrants) -> None:
    unknown = sorted(set(tables) - set(table_grants))
    if unknown:
        raise SchemaError(
            f"schema {schema!r} has table(s) {unknown} that the role policy does not know; "
            "decide who may touch them in the GRANTS of the module that creates them"
        )
    missing = sorted(set(table_grants) - set(tables))
    if missing:
        raise SchemaError(
            f"schema {schema!r} lacks table(s) {missing}: migrate it first (pass `migrate`, "
            "or open qlflow once with the owner URL)"
        )


def _own_tables(conn: psycopg.Connection[Any], schema: str, owner: str) -> None:
    rows = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relkind IN ('r', 'p')
             AND pg_get_userbyid(c.relowner) <> %s""",
        (schema, owner),
    ).fetchall()
    for (table,) in rows:
        conn.execute(
            sql.SQL("ALTER TABLE {}.{} OWNER TO {}").format(
                sql.Identifier(schema), sql.Identifier(table), sql.Identifier(owner)
            )
        )


def _grant_tables(
    conn: psycopg.Connection[Any],
    schema: str,
    tables: list[str],
    names: Mapping[str, str],
    table_grants: TableGrants,
) -> None:
    others = [names[kind] for kind in KINDS if kind != "owner"]
    grantees = sql.SQL(", ").join([sql.SQL("PUBLIC"), *map(sql.Identifier, others)])
    for table in tables:
        target = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
        conn.execute(sql.SQL("REVOKE ALL ON TABLE {} FROM {}").format(target, grantees))
        for kind, privileges in table_grants[table].items():
            conn.execute(
                sql.SQL("GRANT {} ON TABLE {} TO {}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in privileges),
                    target,
                    sql.Identifier(names[kind]),
                )
            )


def _row_security(
    conn: psycopg.Connection[Any],
    schema: str,
    names: Mapping[str, str],
    policies: Sequence[Policy],
) -> None:
    for table in ROW_SECURITY_TABLES:
        target = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
        conn.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(target))
        existing = conn.execute(
            "SELECT policyname FROM pg_policies WHERE schemaname = %s AND tablename = %s",
            (schema, table),
        ).fetchall()
        for (policy,) in existing:
            conn.execute(sql.SQL("DROP POLICY {} ON {}").format(sql.Identifier(policy), target))
    for policy in policies:
        statement = sql.SQL("CREATE POLICY {} ON {}.{} FOR {} TO {}").format(
            sql.Identifier(f"qlflow_{policy.name}"),
            sql.Identifier(schema),
            sql.Identifier(policy.table),
            sql.SQL(policy.command),
            sql.Identifier(names[policy.kind]),
        )
        if policy.using is not None:
            statement += sql.SQL(" USING ({})").format(sql.SQL(policy.using))
        if policy.check is not None:
            statement += sql.SQL(" WITH CHECK ({})").format(sql.SQL(policy.check))
        conn.execute(statement)


def _append_only_trigger(conn: psycopg.Connection[Any], schema: str, owner: str) -> None:
    function = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(APPEND_ONLY_TRIGGER))
    conn.execute(
        sql.SQL(_APPEND_ONLY_FUNCTION).format(function=function, schema=sql.Identifier(schema))
    )
    conn.execute(sql.SQL("ALTER FUNCTION {}() OWNER TO {}").format(function, sql.Identifier(owner)))
    events = sql.SQL("{}.events").format(sql.Identifier(schema))
    for trigger, timing in (
        ("qlflow_events_no_change", "BEFORE UPDATE OR DELETE ON {} FOR EACH ROW"),
        ("qlflow_events_no_truncate", "BEFORE TRUNCATE ON {} FOR EACH STATEMENT"),
    ):
        conn.execute(
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(trigger), events)
        )
        conn.execute(
            sql.SQL("CREATE TRIGGER {} " + timing + " EXECUTE FUNCTION {}()").format(
                sql.Identifier(trigger), events, function
            )
        )


def _append_functions(
    conn: psycopg.Connection[Any],
    schema: str,
    names: Mapping[str, str],
    rights: Mapping[str, Sequence[str]],
) -> None:
    """Who may call the append functions of `eventstore.pg_append`, and on what."""
    table = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(RIGHTS_TABLE))
    conn.execute(sql.SQL("DELETE FROM {}").format(table))
    append = sql.SQL("{}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(APPEND_FUNCTION), sql.SQL(BATCH_TYPES)
    )
    aborting = sql.SQL("{}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(APPEND_OR_ABORT), sql.SQL(BATCH_TYPES)
    )
    core = sql.SQL("{}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(APPEND_CORE), sql.SQL(CORE_TYPES)
    )
    everyone = sql.SQL(", ").join(sql.Identifier(names[kind]) for kind in KINDS if kind != OWNER)
    lock_heads = sql.SQL("{}.{}(text[], boolean)").format(
        sql.Identifier(schema), sql.Identifier(LOCK_HEADS)
    )
    for function in (append, aborting, core, lock_heads):
        conn.execute(
            sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(function, sql.Identifier(names[OWNER]))
        )
        conn.execute(
            sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC, {}").format(function, everyone)
        )
    # only admission's own definer function may append a workflow.admitted record
    conn.execute(
        sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(core, sql.Identifier(names[ADMISSION]))
    )
    for kind, prefixes in rights.items():
        conn.execute(
            sql.SQL("INSERT INTO {} (role, prefixes) VALUES (%s, %s)").format(table),
            (names[kind], list(prefixes)),
        )
        for function in (append, aborting, lock_heads):
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
                    function, sql.Identifier(names[kind])
                )
            )


def _install_function(
    conn: psycopg.Connection[Any],
    schema: str,
    names: Mapping[str, str],
    function: ServerFunction,
) -> None:
    qualified = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(function.name))
    parameters = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
        for name, kind in function.parameters
    )
    head = sql.SQL(
        "CREATE OR REPLACE FUNCTION {}({}) RETURNS {} LANGUAGE plpgsql SECURITY DEFINER "
        "SET search_path = {}, pg_temp AS $body$"
    ).format(qualified, parameters, sql.SQL(function.returns), sql.Identifier(schema))
    # the body is not a format string: its text goes to the server as it is
    conn.execute(head + sql.SQL(function.body) + sql.SQL("$body$"))
    signature = sql.SQL("{}({})").format(
        qualified, sql.SQL(", ").join(sql.SQL(kind) for _name, kind in function.parameters)
    )
    conn.execute(
        sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(
            signature, sql.Identifier(names[function.owner])
        )
    )
    conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(signature))
    for kind in function.executors:
        conn.execute(
            sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
                signature, sql.Identifier(names[kind])
            )
        )
    conn.execute(
        sql.SQL("COMMENT ON FUNCTION {} IS {}").format(signature, sql.Literal(function.comment))
    )


def _check_name(field_name: str, value: object, limit: int) -> None:
    if not isinstance(value, str) or len(value) > limit or not _NAME.fullmatch(value):
        raise InvalidInput(
            field_name,
            "identifier",
            f"{field_name} must be 1-{limit} characters of a-z 0-9 _, not starting with a "
            f"digit, got {value!r}",
        )
