"""The database builds the plan it admits (docs/DESIGN.md, "The start guard in the
database"): `qlflow_admit` compares every `workflow.admitted` plan with the one the
published revision gives, so a client that built its own plan (other steps, a
disabled Task, another source digest, a made-up digest) cannot start it.

`qlflow_plan_refusal(published, workflow_key, plan)` answers NULL or `<reason>:
<what differs>`. It builds, from the `publication.published` data, the plan
`domain.plan.bind_plan` makes for the plan's own run id, timeout and parameter
values (each value of its declared type) and compares the two as JSON values; then
it recomputes the digest over the plan's canonical JSON (`qlflow_canonical_json`,
`domain.canonical` byte for byte for what a plan holds: integer tokens only, ASCII
keys, each key once) and compares it with `plan_digest`. Every constant the SQL
uses (schemas, statuses, the id domain, patterns) comes from the domain modules.
"""

from __future__ import annotations

from domain.canonical import MAX_SAFE_INTEGER
from domain.fields import ID_PATTERN
from domain.flow import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    PLACEHOLDER_PATTERN,
    TASK_LIMIT,
    WORKFLOW_LIMIT,
)
from domain.ids import ID_DOMAIN, STEP_RUN_ID
from domain.params import MAX_STRING_CHARS
from domain.plan_v2 import PLAN_SCHEMA_V1, PLAN_SCHEMA_V2
from domain.transitions import STEP_PENDING, STEP_READY
from eventstore.grants import ADMISSION, OWNER, RUNTIME, ServerFunction

CANONICAL_JSON = "qlflow_canonical_json"
PLAN_REFUSAL = "qlflow_plan_refusal"
LIMIT_KEY = "qlflow_limit_key"
PLAN_REFUSED = "plan_mismatch"  # the reason of every refusal of this check
_VERSION = "qlflow admitted plans v4 (the plan's flow and notify members, step timeouts)"
_NOT_CANONICAL = "QLPC1"  # raised inside, answered as a refusal

_ID_HEX = ID_DOMAIN.hex()

_CANONICAL_BODY = f"""
DECLARE
    kind text := json_typeof(value);
    token text;
    result text;
    members bigint;
    names bigint;
BEGIN
    IF kind = 'object' THEN
        SELECT count(*), count(DISTINCT e.key),
               '{{' || coalesce(string_agg(to_json(e.key)::text || ':'
                                           || {CANONICAL_JSON}(e.value, NULL), ','
                                           ORDER BY e.key COLLATE "C"), '') || '}}'
        INTO members, names, result
        FROM json_each(value) e WHERE skip IS NULL OR e.key <> skip;
        IF members <> names THEN
            RAISE EXCEPTION USING ERRCODE = '{_NOT_CANONICAL}', MESSAGE = 'a key appears twice';
        END IF;
        IF EXISTS (SELECT 1 FROM json_object_keys(value) k WHERE k !~ '^[ -~]*$') THEN
            RAISE EXCEPTION USING ERRCODE = '{_NOT_CANONICAL}', MESSAGE = 'a key is not ASCII';
        END IF;
        RETURN result;
    ELSIF kind = 'array' THEN
        SELECT '[' || coalesce(string_agg({CANONICAL_JSON}(a.v, NULL), ',' ORDER BY a.o), '')
               || ']'
        INTO result FROM json_array_elements(value) WITH ORDINALITY a(v, o);
        RETURN result;
    ELSIF kind = 'string' THEN
        RETURN to_json(value #>> '{{}}')::text;
    ELSIF kind = 'number' THEN
        token := btrim(value::text);
        IF token !~ '^(0|-?[1-9][0-9]{{0,15}})$'
           OR abs(token::numeric) > {MAX_SAFE_INTEGER} THEN
            RAISE EXCEPTION USING ERRCODE = '{_NOT_CANONICAL}',
                MESSAGE = format('%s is not an integer within 2**53', token);
        END IF;
        RETURN token;
    END IF;
    RETURN (value::jsonb)::text;  -- true, false, null
END
"""

# domain.flow.render_key: each {params.<name>} replaced by the bound value's text
_LIMIT_KEY_BODY = f"""
DECLARE
    name text;
    rendered text := template;
BEGIN
    FOR name IN SELECT DISTINCT m[1] FROM regexp_matches(template, '{PLACEHOLDER_PATTERN}', 'g') m
    LOOP
        rendered := replace(rendered, '{{params.' || name || '}}', params ->> name);
    END LOOP;
    RETURN rendered;
END
"""


def _slot_sql(kind: str, name_sql: str, declared_sql: str) -> str:
    """The SlotRef document (domain.flow.SlotRef.document) of a declared limit."""
    return f"""jsonb_build_object(
        'limit', '{kind}:' || (revision ->> 'package') || '/' || {name_sql},
        'slots', CASE WHEN jsonb_typeof({declared_sql}) = 'number' THEN {declared_sql}
                      ELSE {declared_sql} -> 'limit' END)
    || CASE WHEN jsonb_typeof({declared_sql} -> 'key') = 'string'
            THEN jsonb_build_object(
                'key', {LIMIT_KEY}({declared_sql} ->> 'key', coalesce(p -> 'params', '{{}}')))
            ELSE '{{}}'::jsonb END"""


_PLAN_REFUSAL_BODY = f"""
DECLARE
    p jsonb;
    revision jsonb := published -> 'revision';
    ref jsonb := published -> 'publication';
    workflow jsonb := revision -> 'workflows' -> workflow_key;
    declared jsonb := coalesce(workflow -> 'params', '{{}}'::jsonb);
    run_id text;
    v2 boolean;
    steps jsonb;
    expected jsonb;
    differing text;
    encoded text;
    flow jsonb;
    run_limit jsonb;
BEGIN
    IF json_typeof(plan) IS DISTINCT FROM 'object' OR workflow IS NULL THEN
        RETURN '{PLAN_REFUSED}: the admitted record carries no plan of this Workflow';
    END IF;
    p := plan::jsonb;
    run_id := p ->> 'run_id';
    IF jsonb_typeof(p -> 'run_id') IS DISTINCT FROM 'string'
       OR run_id !~ '^{ID_PATTERN.pattern}$' THEN
        RETURN '{PLAN_REFUSED}: the plan''s run_id is not a run id';
    END IF;
    IF NOT (jsonb_typeof(p -> 'timeout_ms') = 'null' OR (jsonb_typeof(p -> 'timeout_ms') =
            'number' AND (p ->> 'timeout_ms')::numeric > 0)) THEN
        RETURN '{PLAN_REFUSED}: the plan''s timeout_ms is not null or a positive integer';
    END IF;
    IF declared <> '{{}}'::jsonb AND (
        jsonb_typeof(p -> 'params') IS DISTINCT FROM 'object'
        OR ARRAY(SELECT k FROM jsonb_object_keys(p -> 'params') k ORDER BY k COLLATE "C")
           IS DISTINCT FROM
           ARRAY(SELECT k FROM jsonb_object_keys(declared) k ORDER BY k COLLATE "C")
        OR EXISTS (SELECT 1 FROM jsonb_each(declared) d(name, decl)
                   WHERE jsonb_typeof(p -> 'params' -> d.name) IS DISTINCT FROM
                         CASE d.decl ->> 'type' WHEN 'integer' THEN 'number'
                                                ELSE d.decl ->> 'type' END
                      OR (d.decl ->> 'type' = 'string'
                          AND length(p -> 'params' ->> d.name) > {MAX_STRING_CHARS}))) THEN
        RETURN '{PLAN_REFUSED}: the plan''s params are not the declared ones, each of its type';
    END IF;
    v2 := declared <> '{{}}'::jsonb OR EXISTS (
        SELECT 1 FROM jsonb_array_elements(workflow -> 'steps') s
        WHERE (s -> 'retry' ->> 'max_attempts')::int > 1);
    -- domain.plan.bind_plan, step for step
    SELECT coalesce(jsonb_agg(x.step ORDER BY x.key COLLATE "C"), '[]'::jsonb) INTO steps
    FROM (SELECT s ->> 'key' AS key, jsonb_build_object(
              'key', s -> 'key',
              'step_run_id', '{STEP_RUN_ID}' || left(encode(sha256(
                  decode('{_ID_HEX}', 'hex') || convert_to('["{STEP_RUN_ID}",'
                  || to_json(run_id)::text || ',' || to_json(s ->> 'key')::text || ']',
                  'UTF8')), 'hex'), 32),
              'task_id', s -> 'task',
              'task_ref', format('%s@%s#%s', revision ->> 'package',
                                 revision ->> 'generation', s ->> 'task'),
              'source_digest', revision -> 'tasks' -> (s ->> 'task') -> 'source_digest',
              'needs', (SELECT coalesce(jsonb_agg(n ORDER BY n COLLATE "C"), '[]'::jsonb)
                        FROM jsonb_array_elements_text(s -> 'needs') n),
              'initial_status', CASE WHEN jsonb_array_length(s -> 'needs') = 0
                                     THEN '{STEP_READY}' ELSE '{STEP_PENDING}' END)
          || CASE WHEN v2 THEN jsonb_build_object('retry', jsonb_build_object(
                 'max_attempts', coalesce((s -> 'retry' ->> 'max_attempts')::int, 1),
                 'backoff_ms', CASE WHEN (s -> 'retry' ->> 'max_attempts')::int > 1
                                    THEN (s -> 'retry' ->> 'backoff_ms')::int ELSE 0 END))
             ELSE '{{}}'::jsonb END
          -- a step's timeout, only where the revision declares one (either schema)
          || CASE WHEN (s -> 'timeout_ms') IS NOT NULL
                  THEN jsonb_build_object('timeout_ms', s -> 'timeout_ms')
                  ELSE '{{}}'::jsonb END AS step
          FROM jsonb_array_elements(workflow -> 'steps') s) x;
    expected := jsonb_build_object(
        'schema', CASE WHEN v2 THEN '{PLAN_SCHEMA_V2}' ELSE '{PLAN_SCHEMA_V1}' END,
        'project', revision -> 'project', 'package', revision -> 'package',
        'installation', revision -> 'installation', 'lock_digest', revision -> 'lock_digest',
        'generation', revision -> 'generation', 'revision_id', revision -> 'revision_id',
        'revision_digest', revision -> 'revision_digest',
        'publication_id', ref -> 'publication_id',
        'publication_digest', ref -> 'publication_digest',
        'workflow_key', to_jsonb(workflow_key),
        'workflow_digest', ref -> 'workflow_digests' -> workflow_key,
        'run_id', p -> 'run_id', 'timeout_ms', p -> 'timeout_ms', 'steps', steps)
        || CASE WHEN v2 THEN jsonb_build_object('params', p -> 'params') ELSE '{{}}'::jsonb END;
    -- domain.flow.bind_flow: the limits the revision declares, keys rendered from the
    -- plan's params; the priority is the start's own, within its range
    IF jsonb_typeof(p -> 'flow' -> 'priority') IS NOT NULL AND NOT (
        jsonb_typeof(p -> 'flow' -> 'priority') = 'number'
        AND (p -> 'flow' ->> 'priority') ~ '^-?[0-9]+$'
        AND (p -> 'flow' ->> 'priority')::numeric BETWEEN {MIN_PRIORITY} AND {MAX_PRIORITY}
        AND (p -> 'flow' ->> 'priority')::numeric <> {DEFAULT_PRIORITY}) THEN
        RETURN '{PLAN_REFUSED}: the plan''s priority is not one a start may give';
    END IF;
    run_limit := coalesce(workflow -> 'max_running', workflow -> 'concurrency');
    SELECT jsonb_object_agg(s ->> 'key', {_slot_sql(TASK_LIMIT, "(s ->> 'task')", "c")})
    INTO steps
    FROM jsonb_array_elements(workflow -> 'steps') s,
         LATERAL (SELECT revision -> 'tasks' -> (s ->> 'task') -> 'concurrency' AS c) t
    WHERE t.c IS NOT NULL;
    flow := jsonb_strip_nulls(jsonb_build_object(
        'priority', p -> 'flow' -> 'priority',
        'run_slot', CASE WHEN run_limit IS NOT NULL
                         THEN {_slot_sql(WORKFLOW_LIMIT, "workflow_key", "run_limit")} END,
        'step_slots', steps));
    IF flow <> '{{}}'::jsonb THEN
        expected := expected || jsonb_build_object('flow', flow);
    END IF;
    -- domain.plan.bind_plan: the Workflow's notify rules, as its revision holds them
    IF workflow -> 'notify' IS NOT NULL THEN
        expected := expected || jsonb_build_object('notify', workflow -> 'notify');
    END IF;
    IF (p - 'plan_digest') IS DISTINCT FROM expected THEN
        SELECT string_agg(k, ', ' ORDER BY k) INTO differing
        FROM jsonb_object_keys(expected || (p - 'plan_digest')) k
        WHERE (p -> k) IS DISTINCT FROM (expected -> k);
        RETURN format('{PLAN_REFUSED}: the plan''s %s differ from what Workflow %s of '
                      'publication %s gives', differing, workflow_key, ref ->> 'publication_id');
    END IF;
    BEGIN
        encoded := {CANONICAL_JSON}(plan, 'plan_digest');
    EXCEPTION WHEN SQLSTATE '{_NOT_CANONICAL}' THEN
        RETURN format('{PLAN_REFUSED}: the plan is not canonical JSON: %s', SQLERRM);
    END;
    IF p ->> 'plan_digest' IS DISTINCT FROM 'sha256:' || encode(sha256(
           convert_to(p ->> 'schema', 'UTF8') || decode('00', 'hex')
           || convert_to(encoded, 'UTF8')), 'hex') THEN
        RETURN '{PLAN_REFUSED}: the plan''s plan_digest is not the digest of its content';
    END IF;
    RETURN NULL;
END
"""

FUNCTIONS = (
    ServerFunction(
        name=LIMIT_KEY,
        parameters=(("template", "text"), ("params", "jsonb")),
        returns="text",
        body=_LIMIT_KEY_BODY,
        owner=ADMISSION,
        executors=(OWNER, RUNTIME),
        comment=_VERSION,
    ),
    ServerFunction(
        name=CANONICAL_JSON,
        parameters=(("value", "json"), ("skip", "text")),
        returns="text",
        body=_CANONICAL_BODY,
        owner=ADMISSION,
        executors=(OWNER, RUNTIME),
        comment=_VERSION,
    ),
    ServerFunction(
        name=PLAN_REFUSAL,
        parameters=(("published", "jsonb"), ("workflow_key", "text"), ("plan", "json")),
        returns="text",
        body=_PLAN_REFUSAL_BODY,
        owner=ADMISSION,
        executors=(OWNER, RUNTIME),
        comment=_VERSION,
    ),
)
