"""The step graph: each Step and the Steps it needs.

The one place that knows what makes a graph of Steps sound — every need names a
Step, no Step needs itself through any path — and the order Steps are visited in.
A manifest, a Workflow definition, a plan and the fold each check their graph
here and say what is wrong in their own words and error type.

Graphs are small (a Workflow has at most 128 Steps), so the search recurses.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


class StepGraphError(ValueError):
    """A step graph is not sound; the subclass says how."""


class UnknownNeed(StepGraphError):
    """Step `step` needs Steps that are not in the graph: `unknown`, in the order
    the Step names them (without repeats)."""

    def __init__(self, step: str, unknown: tuple[str, ...]) -> None:
        self.step = step
        self.unknown = unknown
        super().__init__(f"Step {step!r} needs unknown Step(s) {', '.join(unknown)}")


class DependencyCycle(StepGraphError):
    """The graph has a dependency cycle; `path` is one, as (a, b, ..., a)."""

    def __init__(self, path: tuple[str, ...]) -> None:
        self.path = path
        super().__init__(f"dependency cycle: {' -> '.join(path)}")


def topological_order(needs_by_key: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Every Step key after all the Steps it needs; among Steps free at the same
    time the smallest key comes first, so the order depends on the graph only.

    Problems are reported in the order the Steps are written (the mapping's
    order), so a person reads about the first one first: the first need, Step by
    Step, that names the Step itself (DependencyCycle (a, a)) or no Step at all
    (UnknownNeed, with every unknown need of that Step); then the first cycle
    `find_cycle` meets.
    """
    waiting: dict[str, int] = {}
    dependants: dict[str, list[str]] = {key: [] for key in needs_by_key}
    for key, needs in needs_by_key.items():
        for need in needs:
            if need == key:
                raise DependencyCycle((key, key))
            if need not in dependants:
                unknown = dict.fromkeys(n for n in needs if n not in dependants)
                raise UnknownNeed(key, tuple(unknown))
            dependants[need].append(key)  # a need named twice is counted, and met, twice
        waiting[key] = len(needs)
    free = sorted(key for key, count in waiting.items() if count == 0)  # a sorted list is a heap
    order: list[str] = []
    while free:
        key = heapq.heappop(free)
        order.append(key)
        for dependant in dependants[key]:
            waiting[dependant] -= 1
            if waiting[dependant] == 0:
                heapq.heappush(free, dependant)
    if len(order) != len(needs_by_key):
        cycle = find_cycle(needs_by_key)
        assert cycle is not None  # Kahn's walk stops short only on a cycle
        raise DependencyCycle(tuple(cycle))
    return tuple(order)


def find_cycle(needs_by_key: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Return one dependency cycle as a path [a, b, ..., a], or None if acyclic.

    Edges run from a Step to the Steps it needs; needs naming no key are ignored.
    The search starts from the keys in the mapping's order (the order the Steps are
    written) and follows needs in sorted order, so one mapping always reports the
    same cycle.
    """
    visiting: set[str] = set()
    done: set[str] = set()
    path: list[str] = []

    def visit(key: str) -> list[str] | None:
        visiting.add(key)
        path.append(key)
        for need in sorted(set(needs_by_key[key])):
            if need in visiting:
                return [*path[path.index(need) :], need]
            if need in needs_by_key and need not in done:
                cycle = visit(need)
                if cycle is not None:
                    return cycle
        path.pop()
        visiting.discard(key)
        done.add(key)
        return None

    for key in needs_by_key:
        if key not in done:
            cycle = visit(key)
            if cycle is not None:
                return cycle
    return None
