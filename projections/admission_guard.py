"""The start guard in the database: where least-privilege roles are set up, a Run is
admitted only through `qlflow_admit`, so a client that skipped its own check (or
lied about it) still cannot start what the guard refuses.

`qlflow_start_refusal(...)` is the database's mirror of `domain.start_guard.
start_refusal`: the same rules in the same order, answering the same `reason` (or
NULL). Its text is derived from the domain's status names, and a test runs both over
every guard case. `qlflow_admit(publication, workflow_key, batch...)` (SECURITY
DEFINER, owned by the admission role) takes the publisher's lock — the one
`qlflow_admission_source` and revocation take — reads the publication, its
publisher's trust and its published revision, refuses (SQLSTATE `QLSG1`, the reason
as the message's first word) what the guard refuses or a batch whose
`workflow.admitted` plan is not the one the revision gives (`plan_mismatch`,
projections.admitted_plans), and otherwise
appends the batch through `qlflow_append_core`, the one caller allowed to write
`workflow.admitted` for a restricted role (eventstore.pg_append).
"""

from __future__ import annotations

from domain.values import ACTIVE, QUARANTINED, REVOKED, WITHDRAWN
from eventstore.grants import ADMISSION, OWNER, RUNTIME, ServerFunction
from eventstore.locks import LOCK_TABLE, lock_bucket
from eventstore.pg_append import (
    ADMITTED_TYPE,
    APPEND_CORE,
    BATCH_NAMES,
    BATCH_PARAMETERS,
    GUARD_SQLSTATE,
)
from projections.admitted_plans import PLAN_REFUSAL, PLAN_REFUSED
from projections.publications import PUBLISHER_LOCK_PREFIX

START_REFUSAL = "qlflow_start_refusal"
ADMIT = "qlflow_admit"
_VERSION = (
    "qlflow admission guard v3 (the plan is the revision's; qlflow_locks row; a same-plan"
    " rerun binds its source's publication)"
)

# domain.start_guard.start_refusal, rule for rule
_START_REFUSAL_BODY = f"""
DECLARE
    workflow jsonb;
BEGIN
    IF publisher_status = '{REVOKED}' THEN RETURN 'publisher_revoked'; END IF;
    IF status = '{QUARANTINED}' THEN RETURN 'quarantined'; END IF;
    IF status = '{WITHDRAWN}' THEN RETURN 'withdrawn'; END IF;
    IF status IS DISTINCT FROM '{ACTIVE}' THEN RETURN 'inactive'; END IF;
    IF NOT coalesce(is_head, false) THEN RETURN 'superseded'; END IF;
    workflow := revision -> 'workflows' -> workflow_key;
    IF workflow IS NULL THEN RETURN 'unknown_workflow'; END IF;
    IF (workflow ->> 'enabled')::boolean IS NOT TRUE THEN RETURN 'workflow_disabled'; END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(workflow -> 'steps') step
               WHERE (revision -> 'tasks' -> (step ->> 'task') ->> 'enabled')::boolean
                     IS FALSE) THEN
        RETURN 'task_disabled';
    END IF;
    RETURN NULL;
END
"""

_ADMIT_BODY = f"""
DECLARE
    chosen publications%ROWTYPE;
    trust text;
    published jsonb;
    refusal text;
    admitted text;
    same_plan_rerun boolean;
BEGIN
    SELECT * INTO chosen FROM publications WHERE publication_id = publication;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '{GUARD_SQLSTATE}',
            MESSAGE = format('unknown_publication: no publication %s', publication);
    END IF;
    PERFORM 1 FROM {LOCK_TABLE}
    WHERE bucket = {lock_bucket(f"'{PUBLISHER_LOCK_PREFIX}' || chosen.publisher")} FOR UPDATE;
    -- under the lock: what a revocation, withdrawal or newer generation committed counts
    SELECT * INTO chosen FROM publications WHERE publication_id = publication;
    SELECT status INTO trust FROM publishers WHERE publisher = chosen.publisher;
    SELECT data::jsonb INTO published FROM events
    WHERE stream_id = 'publication-' || publication ORDER BY stream_version LIMIT 1;
    -- a same-plan rerun binds its source's publication even when a newer head superseded
    -- it (domain.start_guard, superseded_ok): every Run the batch admits names a source
    -- Run whose own admission bound this very publication
    same_plan_rerun := '{ADMITTED_TYPE}' = ANY (e_types) AND NOT EXISTS (
        SELECT 1 FROM unnest(e_types, e_data) u(t, d)
        WHERE t = '{ADMITTED_TYPE}' AND (
            (d::jsonb -> 'rerun_of' ->> 'plan') IS DISTINCT FROM 'same'
            OR (SELECT source.publication_id FROM runs source
                WHERE source.run_id = d::jsonb -> 'rerun_of' ->> 'run_id')
               IS DISTINCT FROM publication));
    refusal := {START_REFUSAL}(trust, chosen.status, chosen.head = 1 OR same_plan_rerun,
                               published -> 'revision', workflow_key);
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '{GUARD_SQLSTATE}',
            MESSAGE = format('%s: the database refuses to start %s of publication %s',
                             refusal, workflow_key, publication);
    END IF;
    IF NOT '{ADMITTED_TYPE}' = ANY (e_types) THEN
        RAISE EXCEPTION USING ERRCODE = '{GUARD_SQLSTATE}',
            MESSAGE = format('{PLAN_REFUSED}: the batch does not admit %s of publication %s',
                             workflow_key, publication);
    END IF;
    -- every plan is the one the published revision gives (projections.admitted_plans)
    FOR admitted IN SELECT u.d FROM unnest(e_types, e_data) u(t, d) WHERE t = '{ADMITTED_TYPE}'
    LOOP
        refusal := {PLAN_REFUSAL}(published, workflow_key, admitted::json -> 'plan');
        IF refusal IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '{GUARD_SQLSTATE}', MESSAGE = refusal;
        END IF;
    END LOOP;
    RETURN QUERY SELECT c.positions, c.refused, c.moved
                 FROM {APPEND_CORE}(true, {BATCH_NAMES}) c;
END
"""

FUNCTIONS = (
    ServerFunction(
        name=START_REFUSAL,
        parameters=(
            ("publisher_status", "text"),
            ("status", "text"),
            ("is_head", "boolean"),
            ("revision", "jsonb"),
            ("workflow_key", "text"),
        ),
        returns="text",
        body=_START_REFUSAL_BODY,
        owner=ADMISSION,
        executors=(OWNER, RUNTIME),
        comment=_VERSION,
    ),
    ServerFunction(
        name=ADMIT,
        parameters=(("publication", "text"), ("workflow_key", "text"), *BATCH_PARAMETERS),
        returns="TABLE (positions bigint[], refused text, moved boolean)",
        body=_ADMIT_BODY,
        owner=ADMISSION,
        executors=(OWNER, RUNTIME),
        comment=_VERSION,
    ),
)
