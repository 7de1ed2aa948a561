"""Least-privilege PostgreSQL roles for one qlflow schema (Cluster profile).

`setup_roles(admin_url, schema, prefix)` creates (idempotently) five roles named
`<prefix>_<kind>` and returns a connection URL for each login role:

- **owner** owns the schema and every table. It alone runs migrations (connect as
  it to upgrade) and maintenance (`rebuild_projections`, `verify_projections`), and
  it alone may UPDATE or DELETE events: a trigger refuses everyone else, superusers
  included.
- **runtime** runs the cycle and the workers. Row-level security lets it read and
  append only the `run-`, `steps-`, `lease-` and `admission-` streams (and move
  their heads); it reads and writes the read models of Runs and admission receipts
  and moves the position counter. It has no UPDATE or DELETE on events and cannot
  read the publications, publishers or `publication-`/`publisher-` events: admission
  asks `qlflow_admission_source(target)` (see `admission_source`).
- **admission** (no login) owns that SECURITY DEFINER function and may only SELECT
  the publications and publishers tables and the `publication-` events.
- **publisher** (publisher-admin) publishes, withdraws, quarantines, revokes and
  reinstates: it appends to the `publication-` and `publisher-` streams and writes
  the publications and publishers tables, and sees nothing of the Runs.
- **audit** reads everything, the whole log included, and writes nothing.

Every table qlflow creates must have an entry in `TABLE_GRANTS`: a table the policy
does not know is a SchemaError, so a new table never ships without a decision on who
may touch it. The admin URL must connect as a superuser (it creates roles and hands
objects to them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit

import orjson
import psycopg
from psycopg import sql

from domain.errors import InvalidInput, SchemaError
from domain.records import Record
from domain.values import Publication
from eventstore.url import with_search_path
from eventstore.validation import record_from_row

LOGIN_KINDS = ("owner", "runtime", "publisher", "audit")
KINDS = (*LOGIN_KINDS, "admission")
ADMISSION_SOURCE = "qlflow_admission_source"
APPEND_ONLY_TRIGGER = "qlflow_events_append_only"

RUNTIME_STREAMS = ("run-", "steps-", "lease-", "admission-")
PROVENANCE_STREAMS = ("publication-", "publisher-")
PUBLISHED_STREAM = "publication-"

_READ = ("SELECT",)
_MOVE = ("SELECT", "INSERT", "UPDATE")
# table -> role kind -> privileges. Row-level security narrows `events` and `streams`
# further (see _POLICIES). The owner has everything by owning the tables.
TABLE_GRANTS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "schema_versions": {"runtime": _READ, "publisher": _READ, "audit": _READ},
    "events": {
        "runtime": ("SELECT", "INSERT"),
        "admission": _READ,
        "publisher": ("SELECT", "INSERT"),
        "audit": _READ,
    },
    "streams": {"runtime": _MOVE, "publisher": _MOVE, "audit": _READ},
    "qlflow_position": {
        "runtime": ("SELECT", "UPDATE"),
        "publisher": ("SELECT", "UPDATE"),
        "audit": _READ,
    },
    "runs": {"runtime": _MOVE, "audit": _READ},
    "step_runs": {"runtime": _MOVE, "audit": _READ},
    "attempts": {"runtime": _MOVE, "audit": _READ},
    "admission_receipts": {"runtime": ("SELECT", "INSERT"), "audit": _READ},
    "publications": {"admission": _READ, "publisher": _MOVE, "audit": _READ},
    "publishers": {"admission": _READ, "publisher": _MOVE, "audit": _READ},
}
_STREAM_TABLES = ("events", "streams")
_SETUP_LOCK_KEY = 0x716C666C6F7752  # serialises concurrent role setups
_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_MAX_PREFIX = 40  # leaves room for "_publisher" within PostgreSQL's 63-byte names


def _streams_of(prefixes: tuple[str, ...]) -> str:
    return "(" + " OR ".join(f"starts_with(stream_id, '{p}')" for p in prefixes) + ")"


_RUNTIME = _streams_of(RUNTIME_STREAMS)
_PROVENANCE = _streams_of(PROVENANCE_STREAMS)
_PUBLISHED = _streams_of((PUBLISHED_STREAM,))
# (table, policy, command, role kind, USING, WITH CHECK)
_POLICIES = (
    ("events", "runtime_reads", "SELECT", "runtime", _RUNTIME, None),
    ("events", "runtime_appends", "INSERT", "runtime", None, _RUNTIME),
    ("events", "admission_reads", "SELECT", "admission", _PUBLISHED, None),
    ("events", "publisher_reads", "SELECT", "publisher", _PROVENANCE, None),
    ("events", "publisher_appends", "INSERT", "publisher", None, _PROVENANCE),
    ("events", "audit_reads", "SELECT", "audit", "true", None),
    ("streams", "runtime_reads", "SELECT", "runtime", _RUNTIME, None),
    ("streams", "runtime_creates", "INSERT", "runtime", None, _RUNTIME),
    ("streams", "runtime_moves", "UPDATE", "runtime", _RUNTIME, _RUNTIME),
    ("streams", "publisher_reads", "SELECT", "publisher", _PROVENANCE, None),
    ("streams", "publisher_creates", "INSERT", "publisher", None, _PROVENANCE),
    ("streams", "publisher_moves", "UPDATE", "publisher", _PROVENANCE, _PROVENANCE),
    ("streams", "audit_reads", "SELECT", "audit", "true", None),
)

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

_PUBLICATION_FIELDS = (
    "publication_id, package, publisher, generation, revision_digest, project, installation, "
    "revision_id, publication_digest, lock_digest, workflows, status, head, published_at_ms"
)
# What admission may know about the publication a request names, read under the
# publisher's serialization boundary — the same advisory lock key as
# actors.publishing.serialize_publisher, so admission and revocation still exclude
# each other. Resolution follows actors.admission: an explicit publication id, else
# the heads of the installation named so, else the heads of the package named so.
_ADMISSION_SOURCE_FUNCTION = """
CREATE OR REPLACE FUNCTION {function}(target text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $body$
DECLARE
    matches jsonb;
    chosen jsonb;
    publisher_name text;
    locked text[] := ARRAY[]::text[];
BEGIN
    LOOP
        SELECT coalesce(jsonb_agg(to_jsonb(p)), '[]'::jsonb) INTO matches
        FROM (SELECT {fields} FROM publications WHERE publication_id = target) p;
        IF jsonb_array_length(matches) = 0 THEN
            SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.project, p.installation),
                            '[]'::jsonb) INTO matches
            FROM (SELECT {fields} FROM publications
                  WHERE installation = target AND head = 1) p;
        END IF;
        IF jsonb_array_length(matches) = 0 THEN
            SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.project, p.installation),
                            '[]'::jsonb) INTO matches
            FROM (SELECT {fields} FROM publications WHERE package = target AND head = 1) p;
        END IF;
        IF jsonb_array_length(matches) <> 1 THEN
            RETURN jsonb_build_object('matches', matches);
        END IF;
        publisher_name := matches -> 0 ->> 'publisher';
        EXIT WHEN publisher_name = ANY (locked);
        -- lock, then resolve again: a publish or revocation may have committed meanwhile
        PERFORM pg_advisory_xact_lock(hashtext('qlflow-publisher:' || publisher_name));
        locked := locked || publisher_name;
    END LOOP;
    chosen := matches -> 0;
    RETURN jsonb_build_object(
        'matches', matches,
        'publisher_status',
            (SELECT status FROM publishers WHERE publisher = publisher_name),
        'head',
            (SELECT to_jsonb(p) FROM (SELECT {fields} FROM publications
                WHERE project = chosen ->> 'project'
                  AND installation = chosen ->> 'installation' AND head = 1) p),
        'published',
            (SELECT jsonb_build_array(global_position, event_id, stream_id, stream_version,
                                      type, data, metadata)
             FROM events WHERE stream_id = '{published}' || (chosen ->> 'publication_id')
             ORDER BY stream_version LIMIT 1));
END
$body$
"""


@dataclass(frozen=True, slots=True)
class RoleUrls:
    """What `setup_roles` made: a URL per login role (search_path set to the schema)
    and the role names by kind (owner, runtime, publisher, audit, admission)."""

    schema: str
    owner: str
    runtime: str
    publisher: str
    audit: str
    roles: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AdmissionSource:
    """What `qlflow_admission_source` answered for one target: the publications it
    names (one; none when unknown; several when ambiguous) and, for exactly one, its
    publisher's trust status, the current head of its installation and its
    `publication.published` record."""

    matches: tuple[Publication, ...]
    publisher_status: str | None = None
    head: Publication | None = None
    published: Record | None = None


def role_names(prefix: str) -> dict[str, str]:
    """The role name of each kind for `prefix` (InvalidInput for a bad prefix)."""
    _check_name("prefix", prefix, _MAX_PREFIX)
    return {kind: f"{prefix}_{kind}" for kind in KINDS}


def setup_roles(
    admin_url: str,
    schema: str,
    prefix: str,
    *,
    migrate: Callable[[str], None] | None = None,
    passwords: Mapping[str, str] | None = None,
) -> RoleUrls:
    """Create or repair the roles of `schema` and return their URLs. Idempotent.

    `admin_url` connects as a superuser. `migrate(owner_url)` is called to bring every
    table up to date as the owner before the grants (qlflow's command line passes one
    that opens the runtime, which migrates every component); without it the tables
    must exist already. `passwords` maps login kinds to passwords to set (and put in
    the URLs); kinds without one keep what the server's authentication expects.
    Raises InvalidInput for a bad name or URL and SchemaError for a table the grant
    policy does not know or a missing one.
    """
    _check_name("schema", schema, 63)
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
        _check_tables(tables, schema)
        _own_tables(conn, schema, names["owner"])
        _grant_tables(conn, schema, tables, names)
        _row_security(conn, schema, names)
        _append_only_trigger(conn, schema, names["owner"])
        _admission_function(conn, schema, names)
        for kind in LOGIN_KINDS:
            conn.execute(
                sql.SQL("ALTER ROLE {} IN DATABASE {} SET search_path = {}").format(
                    sql.Identifier(names[kind]),
                    sql.Identifier(conn.info.dbname),
                    sql.Identifier(schema),
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


def has_admission_source(tx) -> bool:
    """Whether the schema of `tx` routes admission through `qlflow_admission_source`
    (PostgreSQL with roles set up); False on SQLite."""
    if tx.dialect != "postgresql":
        return False
    return bool(tx.query(f"SELECT to_regprocedure('{ADMISSION_SOURCE}(text)') IS NOT NULL")[0][0])


def admission_source(tx, target: str) -> AdmissionSource:
    """Ask `qlflow_admission_source` about `target` (a publication id, installation or
    package name) inside the transaction `tx`. When it names exactly one publication,
    the call has also taken that publisher's serialization lock for the transaction."""
    (document,) = tx.query(f"SELECT {ADMISSION_SOURCE}(?)", (target,))[0]
    if isinstance(document, str | bytes):
        document = orjson.loads(document)
    published = document.get("published")
    return AdmissionSource(
        matches=tuple(_publication(row) for row in document["matches"]),
        publisher_status=document.get("publisher_status"),
        head=_publication(document["head"]) if document.get("head") else None,
        published=record_from_row(published) if published else None,
    )


# --- setup steps ---------------------------------------------------------------------


class _admin:
    """One admin transaction: connect, check superuser, commit on success."""

    def __init__(self, admin_url: str) -> None:
        self._url = admin_url

    def __enter__(self) -> psycopg.Connection:
        self._conn = psycopg.connect(self._url, autocommit=False)
        try:
            (superuser,) = self._conn.execute(
                "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchone()
            if not superuser:
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

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._conn.commit()
            else:
                self._conn.rollback()
        finally:
            self._conn.close()


def _lock_setup(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SETUP_LOCK_KEY,))


def _create_roles(
    conn: psycopg.Connection, names: Mapping[str, str], passwords: Mapping[str, str]
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


def _own_schema(conn: psycopg.Connection, schema: str, names: Mapping[str, str]) -> None:
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


def _tables(conn: psycopg.Connection, schema: str) -> list[str]:
    rows = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY c.relname""",
        (schema,),
    ).fetchall()
    return [name for (name,) in rows]


def _check_tables(tables: list[str], schema: str) -> None:
    unknown = sorted(set(tables) - set(TABLE_GRANTS))
    if unknown:
        raise SchemaError(
            f"schema {schema!r} has table(s) {unknown} that the role policy does not know; "
            "decide who may touch them in eventstore.pg_roles.TABLE_GRANTS"
        )
    missing = sorted(set(TABLE_GRANTS) - set(tables))
    if missing:
        raise SchemaError(
            f"schema {schema!r} lacks table(s) {missing}: migrate it first (pass `migrate`, "
            "or open qlflow once with the owner URL)"
        )


def _own_tables(conn: psycopg.Connection, schema: str, owner: str) -> None:
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
    conn: psycopg.Connection, schema: str, tables: list[str], names: Mapping[str, str]
) -> None:
    others = [names[kind] for kind in KINDS if kind != "owner"]
    grantees = sql.SQL(", ").join([sql.SQL("PUBLIC"), *map(sql.Identifier, others)])
    for table in tables:
        target = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
        conn.execute(sql.SQL("REVOKE ALL ON TABLE {} FROM {}").format(target, grantees))
        for kind, privileges in TABLE_GRANTS[table].items():
            conn.execute(
                sql.SQL("GRANT {} ON TABLE {} TO {}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in privileges),
                    target,
                    sql.Identifier(names[kind]),
                )
            )


def _row_security(conn: psycopg.Connection, schema: str, names: Mapping[str, str]) -> None:
    for table in _STREAM_TABLES:
        target = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
        conn.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(target))
        existing = conn.execute(
            "SELECT policyname FROM pg_policies WHERE schemaname = %s AND tablename = %s",
            (schema, table),
        ).fetchall()
        for (policy,) in existing:
            conn.execute(sql.SQL("DROP POLICY {} ON {}").format(sql.Identifier(policy), target))
    for table, policy, command, kind, using, check in _POLICIES:
        statement = sql.SQL("CREATE POLICY {} ON {}.{} FOR {} TO {}").format(
            sql.Identifier(f"qlflow_{policy}"),
            sql.Identifier(schema),
            sql.Identifier(table),
            sql.SQL(command),
            sql.Identifier(names[kind]),
        )
        if using is not None:
            statement += sql.SQL(" USING ({})").format(sql.SQL(using))
        if check is not None:
            statement += sql.SQL(" WITH CHECK ({})").format(sql.SQL(check))
        conn.execute(statement)


def _append_only_trigger(conn: psycopg.Connection, schema: str, owner: str) -> None:
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


def _admission_function(conn: psycopg.Connection, schema: str, names: Mapping[str, str]) -> None:
    function = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(ADMISSION_SOURCE))
    conn.execute(
        sql.SQL(_ADMISSION_SOURCE_FUNCTION).format(
            function=function,
            schema=sql.Identifier(schema),
            fields=sql.SQL(_PUBLICATION_FIELDS),
            published=sql.SQL(PUBLISHED_STREAM),
        )
    )
    signature = sql.SQL("{}(text)").format(function)
    conn.execute(
        sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(
            signature, sql.Identifier(names["admission"])
        )
    )
    conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(signature))
    for kind in ("owner", "runtime"):
        conn.execute(
            sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
                signature, sql.Identifier(names[kind])
            )
        )


def _publication(row: Mapping) -> Publication:
    workflows = row["workflows"]
    return Publication(
        publication_id=row["publication_id"],
        package=row["package"],
        publisher=row["publisher"],
        generation=int(row["generation"]),
        revision_digest=row["revision_digest"],
        project=row["project"],
        installation=row["installation"],
        revision_id=row["revision_id"],
        publication_digest=row["publication_digest"],
        lock_digest=row["lock_digest"],
        workflows=tuple(workflows.split(",")) if workflows else (),
        status=row["status"],
        head=bool(row["head"]),
        published_at_ms=int(row["published_at_ms"]),
    )


def _check_name(field_name: str, value: object, limit: int) -> None:
    if not isinstance(value, str) or len(value) > limit or not _NAME.fullmatch(value):
        raise InvalidInput(
            field_name,
            "identifier",
            f"{field_name} must be 1-{limit} characters of a-z 0-9 _, not starting with a "
            f"digit, got {value!r}",
        )
