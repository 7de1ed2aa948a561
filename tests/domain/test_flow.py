"""Flow control's rules (domain/flow.py, domain/slots.py): declarations, what a plan
binds, and who gets a slot — properties over random facts, no store."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import InvalidInput, ManifestError, PlanError
from domain.flow import (
    MAX_LIMIT,
    MAX_PRIORITY,
    MIN_PRIORITY,
    Concurrency,
    FlowError,
    PlanFlow,
    SlotRef,
    bind_flow,
    effective_limit,
    limit_of,
    parse_concurrency,
    parse_target,
    plan_flow,
    render_key,
    template_params,
)
from domain.manifest import parse_manifest, revision_from_manifest
from domain.revision import revision_from_json, revision_to_json
from domain.slots import (
    SlotBook,
    lease_order,
    queue_order,
    takes_slot_at_admission,
)
from tests.hypothesis_budget import examples

slots = st.sampled_from(["task:p/a", "task:p/a[eu]", "task:p/a[us]", "workflow:p/w"])
counts = st.integers(min_value=1, max_value=6)


def ref_of(slot: str, declared: int) -> SlotRef:
    limit = limit_of(slot)
    key = slot[len(limit) + 1 : -1] if slot != limit else None
    return SlotRef(limit, key, declared)


@settings(max_examples=examples(200))
@given(
    held=st.dictionaries(slots, st.integers(0, 8)),
    overrides=st.dictionaries(
        st.sampled_from(["task:p/a", "task:p/a[eu]", "workflow:p/w"]), counts
    ),
    requests=st.lists(st.tuples(slots, counts), max_size=30),
)
def test_a_book_never_lets_a_slot_past_its_limit(held, overrides, requests):
    """Whatever the order of requests, a slot gets a holder only while it has fewer
    than its effective limit, and a request is refused only when it is full."""
    book = SlotBook(held, overrides, {slot for slot, _ in requests} | set(held))
    count = dict(held)
    for slot, declared in requests:
        ref = ref_of(slot, declared)
        limit = effective_limit(slot, declared, overrides)
        if book.free(ref):
            assert count.get(slot, 0) < limit
            book.take(ref)
            count[slot] = count.get(slot, 0) + 1
        else:
            assert count.get(slot, 0) >= limit
        assert book.held(slot) == count.get(slot, 0)


def test_a_slot_whose_facts_were_not_read_is_never_free():
    book = SlotBook({}, {}, read=())
    assert not book.free(SlotRef("task:p/a", None, 5))
    assert book.free(None)  # no limit: always


def test_the_limit_in_force_is_the_slots_then_its_limits_then_the_declared_one():
    assert effective_limit("task:p/a[eu]", 2, {}) == 2
    assert effective_limit("task:p/a[eu]", 2, {"task:p/a": 5}) == 5
    assert effective_limit("task:p/a[eu]", 2, {"task:p/a": 5, "task:p/a[eu]": 1}) == 1
    assert effective_limit("task:p/a", 2, {"task:p/a[eu]": 1}) == 2


@settings(max_examples=examples(100))
@given(
    runs=st.lists(
        st.tuples(st.integers(MIN_PRIORITY, MAX_PRIORITY), st.integers(0, 50), st.uuids()),
        min_size=2,
        max_size=20,
    )
)
def test_queue_order_is_higher_priority_then_older_then_id(runs):
    ordered = sorted(runs, key=lambda r: queue_order(r[0], r[1], str(r[2])))
    for before, after in itertools.pairwise(ordered):
        assert before[0] > after[0] or (
            before[0] == after[0] and (before[1], str(before[2])) <= (after[1], str(after[2]))
        )


@settings(max_examples=examples(100))
@given(
    attempts=st.lists(
        st.tuples(
            st.integers(-2, 2), st.integers(0, 5), st.sampled_from("abc"), st.integers(0, 99)
        ),
        min_size=2,
        max_size=20,
        unique_by=lambda a: a[3],
    )
)
def test_lease_order_drains_a_run_before_the_next_of_its_priority(attempts):
    """Within one priority, every Attempt of the Run admitted first comes before any
    of a later Run: a backlog drains Run by Run."""
    runs = {}
    for priority, admitted, run, _ in attempts:  # a Run has one priority and admission
        runs.setdefault(run, (priority, admitted))
    attempts = [(*runs[run], run, position) for _, _, run, position in attempts]
    ordered = sorted(attempts, key=lambda a: lease_order(*a))
    seen_done: set[tuple[int, str]] = set()
    previous = None
    for priority, _, run, _ in ordered:
        if previous is not None and previous != (priority, run):
            seen_done.add(previous)
        assert (priority, run) not in seen_done, "a Run's Attempts are not contiguous"
        previous = (priority, run)
    priorities = [a[0] for a in ordered]
    assert priorities == sorted(priorities, reverse=True)


@settings(max_examples=examples(100))
@given(held=st.integers(0, 5), ahead=st.integers(0, 5), declared=counts, set_to=st.none() | counts)
def test_a_run_takes_its_slot_at_admission_only_when_one_is_free_beyond_the_queue(
    held, ahead, declared, set_to
):
    ref = SlotRef("workflow:p/w", None, declared)
    overrides = {} if set_to is None else {"workflow:p/w": set_to}
    limit = declared if set_to is None else set_to
    assert takes_slot_at_admission(ref, held, ahead, overrides) == (held + ahead < limit)


# --- declarations ------------------------------------------------------------------------


def test_a_concurrency_is_a_count_or_a_keyed_table():
    assert parse_concurrency(3) == Concurrency(3)
    assert parse_concurrency({"limit": 1, "key": "{params.region}"}) == Concurrency(
        1, "{params.region}"
    )
    assert template_params("{params.a}-{params.b}-{params.a}") == ("a", "b")
    assert render_key("{params.region}/{params.n}", {"region": "eu", "n": 3}) == "eu/3"
    assert render_key("{params.on}", {"on": True}) == "true"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (0, "concurrency"),
        (MAX_LIMIT + 1, "concurrency"),
        (True, "concurrency"),
        (2.0, "concurrency"),
        ({"limit": 0}, "concurrency.limit"),
        ({"key": "{params.a}"}, "concurrency.limit"),
        ({"limit": 1, "key": "static"}, "concurrency.key"),
        ({"limit": 1, "key": "{params.a}}"}, "concurrency.key"),
        ({"limit": 1, "key": 5}, "concurrency.key"),
        ({"limit": 1, "extra": 1}, "concurrency.extra"),
    ],
)
def test_a_bad_concurrency_is_refused_naming_its_field(raw, field):
    with pytest.raises(FlowError) as refused:
        parse_concurrency(raw)
    assert refused.value.field == field


def test_a_limit_target_names_a_task_or_a_workflow_and_maybe_a_key():
    target = parse_target("task:etl/fetch[eu-1]")
    found = (target.kind, target.package, target.name, target.key)
    assert found == ("task", "etl", "fetch", "eu-1")
    assert target.slot == "task:etl/fetch[eu-1]" and target.limit == "task:etl/fetch"
    for bad in ("etl/fetch", "job:etl/fetch", "task:etl", "task:/x", "task:etl/x[]", 3):
        with pytest.raises(InvalidInput):
            parse_target(bad)


def test_a_plan_flow_reads_back_and_refuses_what_is_not_canonical():
    flow = PlanFlow(
        5,
        SlotRef("workflow:p/w", "eu", 1),
        (("a", SlotRef("task:p/t", None, 2)),),
    )
    assert plan_flow(flow.document(), ("a", "b")) == flow
    for bad in (
        {},
        {"priority": 0},
        {"priority": 1001},
        {"step_slots": {"zz": {"limit": "task:p/t", "slots": 2}}},
        {"run_slot": {"limit": "task:p/t[eu]", "slots": 1}},
        {"run_slot": {"limit": "workflow:p/w", "slots": 0}},
        {"other": 1},
    ):
        with pytest.raises(PlanError):
            plan_flow(bad, ("a",))


def test_bind_flow_renders_keys_from_the_runs_parameters():
    flow = bind_flow(
        "p",
        "w",
        Concurrency(1, "{params.region}"),
        {"a": ("t", Concurrency(2))},
        {"region": "eu"},
        -3,
    )
    assert flow.run_slot == SlotRef("workflow:p/w", "eu", 1)
    assert flow.step_slot("a") == SlotRef("task:p/t", None, 2)
    assert flow.step_slot("b") is None and flow.priority == -3
    with pytest.raises(InvalidInput) as refused:
        bind_flow("p", "w", None, {}, {}, MAX_PRIORITY + 1)
    assert refused.value.field == "priority"


# --- the manifest --------------------------------------------------------------------------

BASE = """
[package]
name = "etl"
publisher = "acme"
[tasks.fetch]
command = ["true"]
{task}
[workflows.w]
steps = [{{ key = "a", task = "fetch" }}]
{workflow}
[workflows.w.params.region]
type = "string"
default = "eu"
"""


def manifest(task: str = "", workflow: str = "") -> str:
    return BASE.format(task=task, workflow=workflow)


def test_declared_limits_and_priority_reach_the_revision_only_where_declared():
    plain = revision_from_manifest(parse_manifest(manifest(), folder=False))
    limited = revision_from_manifest(
        parse_manifest(
            manifest(
                'concurrency = { limit = 2, key = "{params.region}" }',
                "max_running = 1\npriority = 7",
            ),
            folder=False,
        )
    )
    document = revision_to_json(limited)
    assert document["tasks"]["fetch"]["concurrency"] == {"limit": 2, "key": "{params.region}"}
    assert document["workflows"]["w"]["max_running"] == 1
    assert document["workflows"]["w"]["priority"] == 7
    assert revision_from_json(document) == limited
    plain_document = revision_to_json(plain)
    assert "concurrency" not in plain_document["tasks"]["fetch"]
    assert not {"max_running", "priority"} & set(plain_document["workflows"]["w"])
    # a limit is no part of what a Task runs
    assert plain.tasks["fetch"].source_digest == limited.tasks["fetch"].source_digest


@pytest.mark.parametrize(
    ("task", "workflow", "where"),
    [
        ("concurrency = 0", "", "[tasks.fetch] concurrency"),
        ("concurrency = 10001", "", "[tasks.fetch] concurrency"),
        ('concurrency = { limit = 1, key = "{params.zone}" }', "", "[tasks.fetch] concurrency.key"),
        ("", "max_running = -1", "[workflows.w] max_running"),
        ("", 'concurrency = { limit = 1, key = "{params.zone}" }', "concurrency.key"),
        ("", "max_running = 1\nconcurrency = 2", "[workflows.w] concurrency"),
        ("", "priority = 1001", "[workflows.w] priority"),
        ("", "priority = -1001", "[workflows.w] priority"),
        ("", 'priority = "high"', "[workflows.w] priority"),
    ],
)
def test_bad_flow_declarations_are_refused_at_publish_naming_the_field(task, workflow, where):
    with pytest.raises(ManifestError) as refused:
        parse_manifest(manifest(task, workflow), folder=False)
    assert where in str(refused.value)
    if "zone" in task or "zone" in workflow:
        assert "'zone'" in str(refused.value) and "does not declare" in str(refused.value)
