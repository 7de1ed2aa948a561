"""The PostgreSQL append functions: the only way a least-privilege role writes events.

`qlflow_append(...)` is what every PostgreSQL append calls, in one statement (one round
trip with the implicit BEGIN): it checks the batch's shape, the caller's right to each
stream, that every event decodes for its fold (`domain.event_shapes`, generated into
the function as a VALUES list), the expected version of every stream (in stream id
order, a fixed lock order), allocates positions from the one-row counter last (gap safety, see
`eventstore.postgres_store`), inserts the events skipping ids already stored, and says
what happened: the positions, or which stream's CAS failed (`refused`) and whether a
head had moved (`moved`). A conflict never raises, so the caller decides an exact replay
the way SQLite does (`eventstore.transaction`).

Both functions are SECURITY DEFINER, owned by the role that migrated the schema (the
owner), with EXECUTE revoked from PUBLIC: the role setup grants `qlflow_append` to the
runtime and publisher roles and `qlflow_append_core` only to the admission role, whose
`qlflow_admit` (projections.admission_guard) is the one caller that may write a
`workflow.admitted` record for a restricted role. A role with a row in
`qlflow_append_rights` (written by the role setup) is restricted: it may append only to
streams starting with one of its prefixes, and never `workflow.admitted` through
`qlflow_append`. A role without one is the owner (or a superuser), which owns the
tables and could write them directly anyway.

Written as DO blocks so the functions are created in, and pinned to, the schema being
migrated (`SET search_path = <schema>, pg_temp`).
"""

from __future__ import annotations

from domain.event_shapes import SHAPES
from domain.event_types import EventType
from domain.streams import CATEGORIES

APPEND_FUNCTION = "qlflow_append"
APPEND_CORE = "qlflow_append_core"
# the same append, which raises instead of answering a refusal: sent in one pipeline
# with the writes that follow it and COMMIT, a refusal aborts them all
APPEND_OR_ABORT = "qlflow_append_or_abort"
# SQLSTATE of its refusal: the message names the stream whose head was not at the
# expected version and the detail that head's version (both empty: an event id of the
# batch is stored already, elsewhere)
REFUSED_SQLSTATE = "QLAR1"
RIGHTS_TABLE = "qlflow_append_rights"
ADMITTED_TYPE = EventType.WORKFLOW_ADMITTED  # the one type only admission may append
# SQLSTATE of a definer function's refusal to start a Run; the message begins with
# the reason (a domain.start_guard reason), then a colon
GUARD_SQLSTATE = "QLSG1"

# (name, type) of the batch parameters, in order; `qlflow_admit` takes the same after its own
BATCH_PARAMETERS = (
    ("a_streams", "text[]"),
    ("a_expected", "bigint[]"),
    ("a_new", "bigint[]"),
    ("e_ids", "text[]"),
    ("e_streams", "text[]"),
    ("e_versions", "bigint[]"),
    ("e_types", "text[]"),
    ("e_data", "text[]"),
    ("e_metadata", "text[]"),
)
BATCH_TYPES = ", ".join(kind for _name, kind in BATCH_PARAMETERS)
_BATCH_DECLARED = ", ".join(f"{name} {kind}" for name, kind in BATCH_PARAMETERS)
CORE_TYPES = f"boolean, {BATCH_TYPES}"
BATCH_NAMES = ", ".join(name for name, _kind in BATCH_PARAMETERS)
APPEND_RESULT = "OUT positions bigint[], OUT refused text, OUT moved boolean"

# The parts both bodies share: the batch's shape, its content and the caller's
# rights, and the insert under the position counter.
_SHAPE_CHECKS = """\
    IF n = 0 OR m = 0 OR array_length(a_expected, 1) IS DISTINCT FROM m
       OR array_length(a_new, 1) IS DISTINCT FROM m
       OR array_length(e_streams, 1) IS DISTINCT FROM n
       OR array_length(e_versions, 1) IS DISTINCT FROM n
       OR array_length(e_types, 1) IS DISTINCT FROM n
       OR array_length(e_data, 1) IS DISTINCT FROM n
       OR array_length(e_metadata, 1) IS DISTINCT FROM n THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'qlflow_append: a batch needs streams and events, arrays of equal length';
    END IF;
    IF (SELECT count(DISTINCT s) FROM unnest(a_streams) s) <> m
       OR NOT (e_streams <@ a_streams) OR array_position(e_ids, NULL) IS NOT NULL
       OR (SELECT count(DISTINCT i) FROM unnest(e_ids) i) <> n THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'qlflow_append: each stream once, every event on one of them, '
                      'event ids present and distinct';
    END IF;"""
_CONTENT_AND_RIGHTS_CHECKS = f"""\
    IF EXISTS (SELECT 1 FROM unnest(e_types, e_data, e_metadata) u(t, d, md)
               WHERE t IS NULL OR t = '' OR json_typeof(d::json) IS DISTINCT FROM 'object'
                  OR json_typeof(md::json) IS DISTINCT FROM 'object') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'qlflow_append: every event needs a type and JSON objects as data '
                      'and metadata';
    END IF;
    SELECT r.prefixes INTO rights FROM {RIGHTS_TABLE} r WHERE r.role = session_user;
    IF FOUND THEN
        IF EXISTS (SELECT 1 FROM unnest(a_streams) s
                   WHERE NOT EXISTS (SELECT 1 FROM unnest(rights) p WHERE starts_with(s, p)))
        THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = format('permission denied: role %s may not append to stream(s) %s',
                    session_user,
                    (SELECT string_agg(s, ', ') FROM unnest(a_streams) s WHERE NOT EXISTS
                        (SELECT 1 FROM unnest(rights) p WHERE starts_with(s, p))));
        END IF;
        IF NOT admitting AND '{ADMITTED_TYPE}' = ANY (e_types) THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = format('permission denied: role %s may not append {ADMITTED_TYPE}; '
                                 'a Run is admitted only through qlflow_admit', session_user);
        END IF;
    END IF;"""
_INSERT = """\
    -- last: the counter's row lock is held until COMMIT (positions in commit order)
    UPDATE qlflow_position SET last = last + n RETURNING last INTO last_position;
    INSERT INTO events (global_position, event_id, stream_id, stream_version, type, data,
                        metadata)
    SELECT last_position - n + u.o, u.i, u.s, u.v, u.t, u.d, u.md
    FROM unnest(e_ids, e_streams, e_versions, e_types, e_data, e_metadata)
         WITH ORDINALITY u(i, s, v, t, d, md, o)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed <> n THEN
        RETURN;  -- an id was stored already: refused stays NULL, the caller explains
    END IF;
    positions := ARRAY(SELECT last_position - n + g FROM generate_series(1, n) g);
END"""

_CORE_BODY_V1 = f"""
DECLARE
    n integer := coalesce(array_length(e_ids, 1), 0);
    m integer := coalesce(array_length(a_streams, 1), 0);
    rights text[];
    j integer;
    changed integer;
    last_position bigint;
BEGIN
    moved := false;
{_SHAPE_CHECKS}
    FOR j IN 1 .. m LOOP
        IF a_expected[j] IS NULL OR a_new[j] IS NULL OR a_expected[j] < 0
           OR ARRAY(SELECT v FROM unnest(e_streams, e_versions) WITH ORDINALITY u(s, v, o)
                    WHERE s = a_streams[j] ORDER BY o)
              IS DISTINCT FROM ARRAY(SELECT generate_series(a_expected[j] + 1, a_new[j])) THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('qlflow_append: the events of stream %s must have versions '
                                 '%s to %s in order', a_streams[j], a_expected[j] + 1, a_new[j]);
        END IF;
    END LOOP;
{_CONTENT_AND_RIGHTS_CHECKS}
    FOR j IN SELECT o FROM unnest(a_streams) WITH ORDINALITY u(s, o) ORDER BY s COLLATE "C"
    LOOP
        IF a_expected[j] = 0 THEN
            INSERT INTO streams (stream_id, version) VALUES (a_streams[j], a_new[j])
            ON CONFLICT (stream_id) DO NOTHING;
        ELSE
            UPDATE streams SET version = a_new[j]
            WHERE stream_id = a_streams[j] AND version = a_expected[j];
        END IF;
        GET DIAGNOSTICS changed = ROW_COUNT;
        IF changed <> 1 THEN
            refused := a_streams[j];
            RETURN;
        END IF;
        moved := true;
    END LOOP;
{_INSERT}"""

# Schema step 3: the same checks and outcomes, set-based. Step 2's body checked each
# stream's versions with a pass over all events and moved each head with a statement
# of its own: a batch of many Runs (hundreds of streams) cost milliseconds in plpgsql.
_CORE_BODY = f"""
DECLARE
    n integer := coalesce(array_length(e_ids, 1), 0);
    m integer := coalesce(array_length(a_streams, 1), 0);
    rights text[];
    bad text;
    bad_from bigint;
    bad_to bigint;
    done text[];
    last_position bigint;
    changed integer;
BEGIN
    moved := false;
{_SHAPE_CHECKS}
    -- the k-th event of a stream (in call order) has version expected + k, and there
    -- are new - expected of them: its versions are expected+1 .. new, in order
    WITH st AS (SELECT a.s, a.x, a.nw FROM unnest(a_streams, a_expected, a_new) a(s, x, nw)),
         ev AS (SELECT u.s, u.v, row_number() OVER (PARTITION BY u.s ORDER BY u.o) AS k
                FROM unnest(e_streams, e_versions) WITH ORDINALITY u(s, v, o)),
         per AS (SELECT st.s, st.x, st.nw, count(ev.s) AS c,
                        bool_and(ev.v IS NOT DISTINCT FROM st.x + ev.k) AS in_order
                 FROM st LEFT JOIN ev ON ev.s = st.s GROUP BY st.s, st.x, st.nw)
    SELECT per.s, per.x + 1, per.nw INTO bad, bad_from, bad_to FROM per
    WHERE per.x IS NULL OR per.nw IS NULL OR per.x < 0 OR per.c <> per.nw - per.x
       OR NOT coalesce(per.in_order, true)
    ORDER BY per.s COLLATE "C" LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('qlflow_append: the events of stream %s must have versions '
                             '%s to %s in order', bad, bad_from, bad_to);
    END IF;
{_CONTENT_AND_RIGHTS_CHECKS}
    -- the heads in stream id order first (a fixed lock order), then every CAS at once
    PERFORM 1 FROM streams h WHERE h.stream_id = ANY (a_streams)
    ORDER BY h.stream_id COLLATE "C" FOR UPDATE;
    WITH moved_heads AS (
        UPDATE streams h SET version = a.nw
        FROM unnest(a_streams, a_expected, a_new) a(s, x, nw)
        WHERE a.x > 0 AND h.stream_id = a.s AND h.version = a.x
        RETURNING h.stream_id
    ), new_heads AS (
        INSERT INTO streams (stream_id, version)
        SELECT a.s, a.nw FROM unnest(a_streams, a_expected, a_new) a(s, x, nw)
        WHERE a.x = 0 ORDER BY a.s COLLATE "C"
        ON CONFLICT (stream_id) DO NOTHING
        RETURNING stream_id
    )
    SELECT array_agg(d.stream_id) INTO done
    FROM (SELECT stream_id FROM moved_heads UNION ALL SELECT stream_id FROM new_heads) d;
    IF coalesce(array_length(done, 1), 0) <> m THEN
        moved := done IS NOT NULL;
        refused := (SELECT s FROM unnest(a_streams) s WHERE NOT (s = ANY (coalesce(done, '{{}}')))
                    ORDER BY s COLLATE "C" LIMIT 1);
        RETURN;
    END IF;
    moved := true;
{_INSERT}"""


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sql_array(values: tuple[str, ...]) -> str:
    return "ARRAY[" + ", ".join(map(_sql_text, values)) + "]::text[]"


# domain.event_shapes, as a VALUES list: (type, category, required fields, entity path)
_SHAPE_ROWS = ",\n        ".join(
    f"({_sql_text(kind)}, {_sql_text(shape.category)}, {_sql_array(shape.fields)}, "
    f"{_sql_array(shape.entity_field) if shape.entity_field else 'NULL::text[]'})"
    for kind, shape in sorted(SHAPES.items())
)
# Schema step 4: every event decodes (no `?` operators: the store's statements use `?`
# marks) (domain.event_shapes.stream_problem/shape_problem)
_SHAPE_CHECKS = f"""\
    SELECT format('stream %s is not <category>-<entity id> of a known category', s) INTO bad
    FROM unnest(a_streams) s
    WHERE NOT split_part(s, '-', 1) = ANY ({_sql_array(CATEGORIES)})
       OR strpos(s, '-') = 0 OR substr(s, strpos(s, '-') + 1) = ''
    LIMIT 1;
    IF bad IS NULL THEN
        WITH shapes (t, category, fields, entity) AS (VALUES
        {_SHAPE_ROWS})
        SELECT format('event %s (%s on %s): %s', u.i, u.t, u.s, CASE
                   WHEN sh.t IS NULL THEN 'is not a type of docs/EVENTS.md'
                   WHEN sh.category <> split_part(u.s, '-', 1)
                       THEN format('is written to %s- streams', sh.category)
                   WHEN NOT jsonb_exists_all(u.d::jsonb, sh.fields)
                       THEN format('data lacks %s', (SELECT string_agg(f, ', ')
                            FROM unnest(sh.fields) f WHERE NOT jsonb_exists(u.d::jsonb, f)))
                   ELSE format('%s is not the entity of the stream',
                               array_to_string(sh.entity, '.')) END)
        INTO bad
        FROM unnest(e_ids, e_streams, e_types, e_data) WITH ORDINALITY u(i, s, t, d, o)
        LEFT JOIN shapes sh ON sh.t = u.t
        WHERE (sh.t IS NULL AND rights IS NOT NULL)
           OR sh.category <> split_part(u.s, '-', 1)
           OR NOT jsonb_exists_all(u.d::jsonb, sh.fields)
           OR (sh.entity IS NOT NULL AND (u.d::jsonb #> sh.entity)
               IS DISTINCT FROM to_jsonb(substr(u.s, length(sh.category) + 2)))
        ORDER BY u.o LIMIT 1;
    END IF;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'qlflow_append: ' || bad;
    END IF;"""

_CORE_BODY_SHAPED = _CORE_BODY.replace(
    _CONTENT_AND_RIGHTS_CHECKS, _CONTENT_AND_RIGHTS_CHECKS + "\n    bad := NULL;\n" + _SHAPE_CHECKS
)

_WRAPPER_BODY = f"""
BEGIN
    SELECT c.positions, c.refused, c.moved INTO positions, refused, moved
    FROM {APPEND_CORE}(false, {BATCH_NAMES}) c;
END
"""


_ABORTING_BODY = f"""
BEGIN
    SELECT c.positions, c.refused, c.moved INTO positions, refused, moved
    FROM {APPEND_CORE}(false, {BATCH_NAMES}) c;
    IF positions IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '{REFUSED_SQLSTATE}', MESSAGE = coalesce(refused, ''),
            DETAIL = coalesce((SELECT h.version::text FROM streams h WHERE h.stream_id = refused),
                              '');
    END IF;
END
"""


# A statement in a PL/pgSQL function keeps choosing, after its first calls, between
# one generic plan and a plan made for each call's values; `= ANY (array)` looks
# cheaper planned for each call's own array, so the heads' FOR UPDATE was planned
# again at every append (~20 µs each). Nothing in these functions gains from the
# values (primary keys, unnest): the functions made since schema step 11 plan once.
GENERIC_PLANS = " SET plan_cache_mode = force_generic_plan"


def _create(name: str, parameters: str, types: str, body: str, settings: str = "") -> str:
    body = body.replace("%", "%%")  # the text passes through format()
    return f"""DO $do$ BEGIN EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.{name}({parameters}, {APPEND_RESULT})
LANGUAGE plpgsql SECURITY DEFINER SET search_path = %1$I, pg_temp{settings} AS $body${body}$body$
$f$, current_schema());
EXECUTE format('REVOKE ALL ON FUNCTION %I.{name}({types}) FROM PUBLIC', current_schema());
END $do$"""


LOCK_HEADS = "qlflow_lock_heads"
# FOR UPDATE needs UPDATE on the table, which no restricted role has: the heads are
# locked by this definer function (the locks last until the caller's COMMIT)
_LOCK_HEADS_BODY = f"""
DECLARE
    rights text[];
BEGIN
    SELECT r.prefixes INTO rights FROM {RIGHTS_TABLE} r WHERE r.role = session_user;
    IF FOUND AND EXISTS (SELECT 1 FROM unnest(stream_ids) s
                         WHERE NOT EXISTS (SELECT 1 FROM unnest(rights) p
                                           WHERE starts_with(s, p))) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('permission denied: role %s may not lock those stream heads',
                             session_user);
    END IF;
    IF wait THEN
        RETURN QUERY SELECT h.stream_id::text, h.version FROM streams h
                     WHERE h.stream_id = ANY (stream_ids) ORDER BY h.stream_id FOR UPDATE;
    ELSE
        RETURN QUERY SELECT h.stream_id::text, h.version FROM streams h
                     WHERE h.stream_id = ANY (stream_ids) FOR UPDATE SKIP LOCKED;
    END IF;
END
"""


def _create_lock_heads(settings: str = "") -> str:
    body = _LOCK_HEADS_BODY.replace("%", "%%")
    return f"""DO $do$ BEGIN EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.{LOCK_HEADS}(stream_ids text[], wait boolean)
RETURNS TABLE (stream_id text, version bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = %1$I, pg_temp{settings} AS $body${body}$body$
$f$, current_schema());
EXECUTE format('REVOKE ALL ON FUNCTION %I.{LOCK_HEADS}(text[], boolean) FROM PUBLIC',
               current_schema());
END $do$"""


MIGRATION: tuple[str, ...] = (
    f"CREATE TABLE {RIGHTS_TABLE} (role TEXT PRIMARY KEY, prefixes TEXT[] NOT NULL)",
    _create(APPEND_CORE, f"admitting boolean, {_BATCH_DECLARED}", CORE_TYPES, _CORE_BODY_V1),
    _create(APPEND_FUNCTION, _BATCH_DECLARED, BATCH_TYPES, _WRAPPER_BODY),
    _create_lock_heads(),
)
"""The PostgreSQL statements of eventstore schema step 2."""

SET_BASED: tuple[str, ...] = (
    _create(APPEND_CORE, f"admitting boolean, {_BATCH_DECLARED}", CORE_TYPES, _CORE_BODY),
)
"""The PostgreSQL statements of eventstore schema step 3: the append, set-based
(`CREATE OR REPLACE` keeps the function's owner and grants)."""

SHAPED: tuple[str, ...] = (
    _create(APPEND_CORE, f"admitting boolean, {_BATCH_DECLARED}", CORE_TYPES, _CORE_BODY_SHAPED),
)
"""The PostgreSQL statements of eventstore schema step 4: the append refuses an event
its fold could not decode (domain.event_shapes). A change to those shapes ships as a
new step, like any other change to a shipped function."""

ABORTING: tuple[str, ...] = (
    _create(APPEND_OR_ABORT, _BATCH_DECLARED, BATCH_TYPES, _ABORTING_BODY),
)
"""The PostgreSQL statements of eventstore schema step 10: `qlflow_append_or_abort`, the
append a writer sends in one pipeline with COMMIT (docs/DESIGN.md "Two round trips")."""

PLANNED_ONCE: tuple[str, ...] = (
    _create(
        APPEND_CORE,
        f"admitting boolean, {_BATCH_DECLARED}",
        CORE_TYPES,
        _CORE_BODY_SHAPED,
        GENERIC_PLANS,
    ),
    _create_lock_heads(GENERIC_PLANS),
)
"""The PostgreSQL statements of eventstore schema step 11: the append's core and the
heads' lock again, with generic plans (`GENERIC_PLANS`). A later step that makes
either function again passes `GENERIC_PLANS` too (`CREATE OR REPLACE` replaces the
settings with its own)."""

# binary parameters: a text array in text format is quoted and escaped element by
# element (a regular expression per JSON document), in binary it is copied as is
BATCH_MARKS = ", ".join(f"%b::{kind}" for _name, kind in BATCH_PARAMETERS)
APPEND_SQL = f"SELECT positions, refused, moved FROM {APPEND_FUNCTION}({BATCH_MARKS})"
APPEND_OR_ABORT_SQL = f"SELECT positions FROM {APPEND_OR_ABORT}({BATCH_MARKS})"
