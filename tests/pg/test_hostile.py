"""Hostile clients against a `qlflow pg-roles` deployment: each attack goes through
the functions a role may call, is refused, writes nothing, and an honest runtime
keeps working with `verify` clean afterwards (docs/DESIGN.md, "Hostile clients")."""

from __future__ import annotations

import time

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qlflow
from actors import admission
from actors import roles as pg_roles
from domain.errors import NotFound
from domain.plan import PlannedWorkflow, bind_plan, plan_to_dict, step_run_ids_for
from domain.publication import publication_from_json
from domain.revision import revision_from_json
from projections import views
from projections.task_io import task_definition
from tests.cycle.helpers import T0, drive

pytestmark = pytest.mark.pg

TWO_WORKFLOWS = {
    "package": {"name": "demo", "publisher": "acme"},
    "tasks": {
        "a": {"command": ["true"]},
        "b": {"command": ["true"]},
        "off": {"command": ["true"], "enabled": False},
    },
    "workflows": {
        "w": {"steps": [{"key": "a", "task": "a", "needs": []},
                        {"key": "b", "task": "b", "needs": ["a"]}]},
        "w2": {"steps": [{"key": "x", "task": "off", "needs": []}]},
        "p": {
            "params": {"name": {"type": "string", "default": "n"},
                       "count": {"type": "integer", "default": 1}},
            "steps": [{"key": "a", "task": "a", "needs": [],
                       "retry": {"max_attempts": 3, "backoff_ms": 10}}],
        },
    },
}  # fmt: skip


def sql_as(url: str, statement: str, params=None):
    with psycopg.connect(url) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def event_count(roles) -> int:
    return sql_as(roles.owner, "SELECT count(*) FROM events")[0][0]


def assert_honest_runtime_works(roles, key: str) -> None:
    """An honest runtime (a process of its own) starts a Run and runs it to the end,
    and the owner's verify is clean."""
    with qlflow.open(roles.runtime) as honest:
        receipt = honest.start("demo", "w", admission_key=key, now_ms=T0)
        drive(honest, T0)
        assert honest.get_run(receipt.run_id).status == "succeeded"
    with qlflow.open(roles.owner) as owner:
        report = owner.verify_projections()
    assert report.ok, report


@pytest.fixture
def published(rt, roles):
    """The deployment with TWO_WORKFLOWS published: (publication ref, revision, data)."""
    rt.publish(TWO_WORKFLOWS, now_ms=T0)
    [(data,)] = sql_as(
        roles.owner, "SELECT data FROM events WHERE type = 'publication.published' LIMIT 1"
    )
    document = orjson.loads(data)
    return (
        publication_from_json(document["publication"]),
        revision_from_json(document["revision"]),
        document,
    )


def honest_plan(ref, revision, workflow_key: str, run_id: str = "run-1", **bound) -> dict:
    planned = admission.plan_workflow(ref, revision, workflow_key)
    ids = step_run_ids_for(run_id, [step.key for step in planned.workflow.steps])
    return plan_to_dict(bind_plan(planned, run_id, ids, bound.pop("timeout_ms", None), bound))


def refusal(roles, document, workflow_key: str, plan: dict | str) -> str | None:
    text = plan if isinstance(plan, str) else orjson.dumps(plan).decode()
    [(answer,)] = sql_as(
        roles.runtime,
        "SELECT qlflow_plan_refusal(%s::jsonb, %s, %s::json)",
        (orjson.dumps(document).decode(), workflow_key, text),
    )
    return answer


# --- 1. the database admits only a plan it could have built -----------------------------


def test_a_client_built_plan_with_another_workflows_steps_is_refused(
    rt, roles, published, monkeypatch
):
    real = admission.plan_workflow

    def forged(publication, revision, workflow_key):
        # the client's own plan_workflow, patched: Workflow w labelled, w2's steps inside
        honest = real(publication, revision, workflow_key)
        return PlannedWorkflow(
            honest.publication, revision, workflow_key, revision.workflows["w2"],
            honest.workflow_digest,
        )  # fmt: skip

    monkeypatch.setattr(admission, "plan_workflow", forged)
    before = event_count(roles)

    with pytest.raises(qlflow.errors.StartGuardError) as caught:
        rt.start("demo", "w", admission_key="forged", now_ms=T0)

    assert caught.value.reason == "plan_mismatch"
    assert "steps" in str(caught.value)
    assert event_count(roles) == before
    monkeypatch.undo()
    assert_honest_runtime_works(roles, "honest")


def test_every_honest_plan_is_admitted_by_the_database(roles, published):
    ref, revision, document = published
    assert refusal(roles, document, "w", honest_plan(ref, revision, "w")) is None
    assert refusal(roles, document, "w", honest_plan(ref, revision, "w", timeout_ms=5)) is None
    plan = honest_plan(ref, revision, "p", name="x", count=-7)
    assert plan["schema"].endswith("@v2")
    assert refusal(roles, document, "p", plan) is None


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                 max_size=40),
    count=st.integers(-(2**53) + 1, 2**53 - 1),
)  # fmt: skip
def test_the_database_digest_is_the_domains_byte_for_byte(roles, published, name, count):
    ref, revision, document = published
    plan = honest_plan(ref, revision, "p", name=name, count=count)
    assert refusal(roles, document, "p", plan) is None


def _with(plan: dict, **changes) -> dict:
    return {**plan, **changes}


def _step(plan: dict, **changes) -> dict:
    return {**plan, "steps": [{**plan["steps"][0], **changes}, *plan["steps"][1:]]}


FORGERIES = {
    "other workflow key": lambda p: _with(p, workflow_key="w2"),
    "other source digest": lambda p: _step(p, source_digest="sha256:" + "1" * 64),
    "other task": lambda p: _step(p, task_id="off", task_ref="demo@1#off"),
    "other step run id": lambda p: _step(p, step_run_id="srn:" + "0" * 32),
    "a need dropped": lambda p: {**p, "steps": [p["steps"][0], {**p["steps"][1], "needs": [],
                                 "initial_status": "ready"}]},
    "a step dropped": lambda p: _with(p, steps=p["steps"][:1]),
    "an extra field": lambda p: _with(p, extra=1),
    "a wrong digest": lambda p: _with(p, plan_digest="sha256:" + "2" * 64),
    "a negative timeout": lambda p: _with(p, timeout_ms=-1),
    "a bad run id": lambda p: _with(p, run_id="bad id"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forged_plan_is_refused_by_the_database(roles, published, name):
    ref, revision, document = published
    plan = FORGERIES[name](honest_plan(ref, revision, "w"))
    answer = refusal(roles, document, "w", plan)
    assert answer is not None and answer.startswith("plan_mismatch:"), (name, answer)


@pytest.mark.parametrize(
    ("name", "rewrite"),
    [
        ("a float token", lambda text: text.replace('"timeout_ms":5', '"timeout_ms":5.0')),
        ("an exponent", lambda text: text.replace('"timeout_ms":5', '"timeout_ms":5e0')),
        ("a key twice", lambda text: text.replace('{"schema"', '{"timeout_ms":5,"schema"', 1)),
    ],
)
def test_a_plan_whose_text_the_domain_reads_otherwise_is_refused(roles, published, name, rewrite):
    ref, revision, document = published
    text = orjson.dumps(honest_plan(ref, revision, "w", timeout_ms=5)).decode()
    forged = rewrite(text)
    assert forged != text
    answer = refusal(roles, document, "w", forged)
    assert answer is not None and answer.startswith("plan_mismatch:"), (name, answer)


def test_a_worker_is_not_given_a_disabled_tasks_definition(rt, roles, published):
    receipt = rt.start("demo", "w", admission_key="k", now_ms=T0)
    store = rt.runtime.store
    publication_id = views.get_run(store, receipt.run_id).publication_id
    assert task_definition(store, publication_id, "demo@1#a").task_id == "a"
    with pytest.raises(NotFound, match="disabled"):
        task_definition(store, publication_id, "demo@1#off")


# --- 2. every appended event decodes ---------------------------------------------------

APPEND = (
    "SELECT positions, refused, moved FROM qlflow_append(%s::text[], %s::bigint[], "
    "%s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[])"
)
LEASE = {"lease_id": "l", "worker_id": "w", "granted_at_ms": 1, "ttl_ms": 1, "expires_at_ms": 2}
UNDECODABLE = {
    "step.created without its fields": ("runtime", "run-x", "step.created", {}, "data lacks"),
    "a bare run- stream": ("runtime", "run-", "workflow.cancel_requested",
                           {"reason": "user", "requested_at_ms": 1}, "stream run- is not"),
    "a type no fold reads": ("runtime", "run-x", "step.exploded", {}, "is not a type"),
    "a type on another category": ("runtime", "steps-x", "workflow.cancel_requested",
                                   {"reason": "user", "requested_at_ms": 1}, "is written to run-"),
    "a lease of another Attempt": ("runtime", "lease-a", "lease.granted",
                                   {**LEASE, "attempt_id": "b"}, "attempt_id is not the entity"),
    "a withdrawal of another publication": (
        "publisher", "publication-a", "publication.withdrawn",
        {"publication_id": "b", "at_ms": 1, "reason": "x"}, "publication_id is not the entity",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(UNDECODABLE))
def test_an_event_its_fold_cannot_read_is_refused(roles, published, name):
    kind, stream, type_, data, says = UNDECODABLE[name]
    before = event_count(roles)
    params = ([stream], [0], [1], ["forged-1"], [stream], [1], [type_],
              [orjson.dumps(data).decode()], ['{"at_ms": 1}'])  # fmt: skip

    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        sql_as(getattr(roles, kind), APPEND, params)

    assert says in str(caught.value), str(caught.value)
    assert event_count(roles) == before
    assert_honest_runtime_works(roles, f"after-{name.replace(' ', '-')}")


# --- 3. no role can stall another --------------------------------------------------------


def test_the_audit_role_cannot_hold_a_lock_others_wait_on(rt, roles, published):
    # the attack of old: the publisher lock's advisory key, held by an audit session
    holder = psycopg.connect(roles.audit, autocommit=True)
    try:
        holder.execute(
            "SELECT pg_advisory_lock(hashtextextended(current_schema() || %s, 0))",
            ("/qlflow-publisher:acme",),
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            holder.execute("SELECT 1 FROM qlflow_locks FOR UPDATE")
        with qlflow.open(roles.runtime, lock_timeout_ms=300) as runtime:
            runtime.start("demo", "w", admission_key="audit-holds", now_ms=T0)
        rt.publish({**TWO_WORKFLOWS, "tasks": {**TWO_WORKFLOWS["tasks"], "c": {
            "command": ["true"]}}}, now_ms=T0 + 1)  # fmt: skip
    finally:
        holder.close()
    assert_honest_runtime_works(roles, "after-audit")


def test_a_runtime_session_idle_in_a_transaction_is_cut_off(roles, published, pg_server_url):
    prefix = roles.roles["owner"].removesuffix("_owner")
    pg_roles.setup_roles(pg_server_url, roles.schema, prefix, idle_in_transaction_ms=1000)
    idle = psycopg.connect(roles.runtime)
    stream = "run-idle"
    idle.execute(
        APPEND,
        ([stream], [0], [1], ["idle-1"], [stream], [1], ["workflow.cancel_requested"],
         ['{"reason": "user", "requested_at_ms": 1}'], ['{"at_ms": 1}']),
    )  # fmt: skip
    try:
        # the idle session holds the position counter: every other append waits for it
        began = time.monotonic()
        assert_honest_runtime_works(roles, "while-idle")
        assert time.monotonic() - began < 30
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            idle.execute("SELECT 1")
    finally:
        idle.close()
    assert sql_as(roles.owner, "SELECT count(*) FROM events WHERE stream_id = %s", (stream,)) == [
        (0,)
    ]


# --- flow control: the plan's flow member is the revision's, the priority the start's ------

FLOW = {
    "package": {"name": "flowdemo", "publisher": "acme"},
    "tasks": {
        "a": {"command": ["true"], "concurrency": {"limit": 1, "key": "{params.region}"}},
        "b": {"command": ["true"]},
    },
    "workflows": {
        "q": {
            "max_running": 1,
            "priority": 3,
            "params": {"region": {"type": "string", "default": "eu"}},
            "steps": [{"key": "a", "task": "a"}, {"key": "b", "task": "b", "needs": ["a"]}],
        }
    },
}


def test_a_plan_with_limits_and_a_priority_is_admitted_and_a_forged_flow_is_not(rt, roles):
    rt.publish(FLOW, now_ms=T0)
    first = rt.start("flowdemo", "q", params={"region": "us"}, priority=7, now_ms=T0)
    second = rt.start("flowdemo", "q", now_ms=T0 + 1)  # the Workflow's one slot is taken
    assert first.status == second.status == "created"
    [view] = [v for v in rt.limits(now_ms=T0 + 2) if v.target == "workflow:flowdemo/q"]
    assert (view.in_use, view.waiting) == (1, 1)
    [(data,)] = sql_as(
        roles.owner,
        "SELECT data FROM events WHERE type = 'publication.published' "
        "AND data::jsonb -> 'revision' ->> 'package' = 'flowdemo'",
    )
    document = orjson.loads(data)
    ref, revision = (
        publication_from_json(document["publication"]),
        revision_from_json(document["revision"]),
    )
    planned = admission.plan_workflow(ref, revision, "q")
    ids = step_run_ids_for("run-9", [step.key for step in planned.workflow.steps])
    honest = plan_to_dict(bind_plan(planned, "run-9", ids, None, {"region": "fr"}, -4))
    assert honest["flow"]["step_slots"]["a"]["key"] == "fr"
    assert refusal(roles, document, "q", honest) is None
    for path, value in (
        (("step_slots", "a", "slots"), 99),  # more slots than declared
        (("step_slots", "a", "key"), "eu"),  # another key than the params give
        (("run_slot", "slots"), 5),
        (("priority",), 5_000),  # out of range
    ):
        forged = orjson.loads(orjson.dumps(honest))
        target = forged["flow"]
        for name in path[:-1]:
            target = target[name]
        target[path[-1]] = value
        answer = refusal(roles, document, "q", forged)
        assert answer is not None and answer.startswith("plan_mismatch"), (path, answer)
    no_limit = orjson.loads(orjson.dumps(honest))
    del no_limit["flow"]["step_slots"]  # a plan that leaves its Task's limit out
    assert refusal(roles, document, "q", no_limit).startswith("plan_mismatch")


# --- notifications: the plan's notify member is the revision's ---------------------------

NOTIFYING = {
    "package": {"name": "notifydemo", "publisher": "acme"},
    "tasks": {"a": {"command": ["true"]}},
    "workflows": {
        "n": {
            "notify": [{"on": ["failed"], "webhook": "https://hooks.example/n"}],
            "steps": [{"key": "a", "task": "a"}],
        }
    },
}


def test_a_plan_with_notify_rules_is_admitted_and_a_forged_rule_is_not(rt, roles):
    rt.publish(NOTIFYING, now_ms=T0)
    assert rt.start("notifydemo", "n", now_ms=T0).status == "created"
    [(data,)] = sql_as(
        roles.owner,
        "SELECT data FROM events WHERE type = 'publication.published' "
        "AND data::jsonb -> 'revision' ->> 'package' = 'notifydemo'",
    )
    document = orjson.loads(data)
    ref = publication_from_json(document["publication"])
    honest = honest_plan(ref, revision_from_json(document["revision"]), "n", "run-7")
    assert honest["notify"] == [{"on": ["failed"], "webhook": "https://hooks.example/n"}]
    assert refusal(roles, document, "n", honest) is None
    for forged_rules in ([{"on": ["failed"], "webhook": "https://evil.example/"}], None):
        forged = orjson.loads(orjson.dumps(honest))
        if forged_rules is None:
            del forged["notify"]  # a plan that drops the rules: nobody would be told
        else:
            forged["notify"] = forged_rules
        answer = refusal(roles, document, "n", forged)
        assert answer is not None and answer.startswith("plan_mismatch"), answer
