"""The step graph: one routine decides unknown needs, cycles and the stable order,
and every caller (Workflow definitions and plans, manifests, the fold) agrees."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import CorruptionError, ManifestError, PlanError
from domain.graph import DependencyCycle, UnknownNeed, find_cycle, topological_order
from domain.manifest import validate_manifest
from domain.workflows import check_step_graph
from tests.domain.strategies import World, make_plan
from tests.hypothesis_budget import examples

NAMES = [f"s{i}" for i in range(7)]


@st.composite
def dags(draw) -> dict[str, list[str]]:
    """An acyclic graph written in a random order: each Step needs only Steps drawn
    before it."""
    keys = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=7, unique=True))
    graph: dict[str, list[str]] = {}
    for index, key in enumerate(keys):
        earlier = keys[:index]
        graph[key] = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
    order = draw(st.permutations(keys))
    return {key: graph[key] for key in order}


@st.composite
def graphs(draw) -> dict[str, list[str]]:
    """Any graph, with cycles, self-needs and needs naming no Step, but no need twice."""
    keys = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=7, unique=True))
    targets = st.sampled_from([*keys, "ghost", "zz"])
    return {key: draw(st.lists(targets, max_size=3, unique=True)) for key in keys}


def smallest_free_order(graph: dict[str, list[str]]) -> tuple[str, ...]:
    """The order the rule describes, found the slow way: again and again, the smallest
    key whose needs are all placed."""
    placed: list[str] = []
    while len(placed) < len(graph):
        free = [k for k in graph if k not in placed and set(graph[k]) <= set(placed)]
        placed.append(min(free))
    return tuple(placed)


@settings(max_examples=examples(200), deadline=None)
@given(dags())
def test_every_step_comes_after_its_needs_and_ties_go_to_the_smallest_key(graph) -> None:
    order = topological_order(graph)
    assert sorted(order) == sorted(graph)
    for key, needs in graph.items():
        assert all(order.index(need) < order.index(key) for need in needs)
    assert order == smallest_free_order(graph)


@settings(max_examples=examples(100), deadline=None)
@given(dags(), st.randoms(use_true_random=False))
def test_the_order_does_not_depend_on_how_the_steps_are_written(graph, rnd: random.Random) -> None:
    keys = list(graph)
    rnd.shuffle(keys)
    rewritten = {key: list(reversed(graph[key])) for key in keys}
    assert topological_order(rewritten) == topological_order(graph)


def test_an_unknown_need_names_the_first_step_as_written_and_all_its_unknown_needs() -> None:
    with pytest.raises(UnknownNeed) as caught:
        topological_order({"b": [], "c": ["x", "b", "w", "x"], "a": ["y"]})
    assert (caught.value.step, caught.value.unknown) == ("c", ("x", "w"))


def test_a_self_need_is_a_cycle_of_one_step() -> None:
    with pytest.raises(DependencyCycle) as caught:
        topological_order({"a": [], "b": ["b"]})
    assert caught.value.path == ("b", "b")


def test_the_first_problem_as_written_is_the_one_reported() -> None:
    with pytest.raises(DependencyCycle) as cycle:
        topological_order({"b": ["b"], "a": ["ghost"]})
    assert cycle.value.path == ("b", "b")
    with pytest.raises(UnknownNeed) as unknown:
        topological_order({"a": ["ghost"], "b": ["b"]})
    assert unknown.value.step == "a"
    with pytest.raises(DependencyCycle) as longer:
        topological_order({"c": ["b"], "b": ["c"], "a": ["b"]})
    assert longer.value.path == ("c", "b", "c")


@settings(max_examples=examples(200), deadline=None)
@given(graphs())
def test_a_graph_is_refused_exactly_when_it_has_a_problem_and_the_problem_is_real(
    graph,
) -> None:
    unknown = {key: [n for n in needs if n not in graph] for key, needs in graph.items()}
    try:
        topological_order(graph)
    except UnknownNeed as problem:
        assert list(problem.unknown) == unknown[problem.step] != []
    except DependencyCycle as problem:
        path = problem.path
        assert path[0] == path[-1] and len(path) >= 2
        assert all(b in graph[a] for a, b in itertools.pairwise(path))
    else:
        assert not any(unknown.values()) and find_cycle(graph) is None


def _plan_rule(graph: dict[str, list[str]]) -> str | None:
    try:
        check_step_graph(list(graph.items()), "Workflow 'w'")
    except PlanError as error:
        return error.rule
    return None


def _manifest_refusal(graph: dict[str, list[str]]) -> str | None:
    raw = {
        "package": {"name": "pkg", "publisher": "acme"},
        "tasks": {"t": {"command": ["true"]}},
        "workflows": {
            "w": {"steps": [{"key": k, "task": "t", "needs": n} for k, n in graph.items()]}
        },
    }
    try:
        validate_manifest(raw)
    except ManifestError as error:
        return str(error)
    return None


def _fold_refusal(graph: dict[str, list[str]]) -> str | None:
    try:
        World(make_plan(graph))  # admits the plan as written and folds the records
    except CorruptionError as error:
        return str(error)
    return None


def _problem(graph: dict[str, list[str]]) -> str | None:
    try:
        topological_order(graph)
    except UnknownNeed:
        return "unknown"
    except DependencyCycle:
        return "cycle"
    return None


@settings(max_examples=examples(150), deadline=None)
@given(graphs())
def test_definitions_manifests_and_the_fold_refuse_the_same_graphs(graph) -> None:
    # Problems are reported in the order Steps and needs are given: a manifest
    # gives its steps as written with each step's needs sorted; a Workflow check
    # visits Steps in key order; a plan (and so the fold) holds Steps and needs
    # sorted. Each says the graph's answer in its own words.
    as_written = _problem({key: sorted(needs) for key, needs in graph.items()})
    by_key = _problem(dict(sorted(graph.items())))
    sorted_plan = _problem({key: sorted(graph[key]) for key in sorted(graph)})
    manifest = _manifest_refusal(graph)
    if as_written is None:
        assert manifest is None
    elif as_written == "unknown":
        assert manifest is not None and "unknown step" in manifest
    else:
        assert manifest is not None and ("cycle: " in manifest or "needs itself" in manifest)
    plan_rule = _plan_rule(graph)
    assert plan_rule == {None: None, "unknown": "unknown_need", "cycle": "cycle"}[by_key]
    folded = _fold_refusal(graph)
    if sorted_plan is None:
        assert folded is None
    elif sorted_plan == "unknown":
        assert folded is not None and "needs unknown step" in folded
    else:
        assert folded is not None and "has a cycle" in folded
    assert (as_written is None) == (by_key is None) == (sorted_plan is None)
