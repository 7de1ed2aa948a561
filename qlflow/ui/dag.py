"""A Run's DAG laid out for an SVG: one column per dependency depth, left to right.

Depth is the longest path from a step without needs (depth 0), so every edge points
right. Within a column, steps are ordered by the mean row of what they need (fewer
crossings), then by key. Pure: steps in, coordinates out; the template draws them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

NODE_WIDTH = 176
NODE_HEIGHT = 52
COLUMN_GAP = 64
ROW_GAP = 16
MARGIN = 12
LABEL_CHARS = 22


class StepLike(Protocol):
    @property
    def needs(self) -> Sequence[str]: ...
    @property
    def status(self) -> str: ...
    @property
    def attempts(self) -> Sequence[object]: ...


@dataclass(frozen=True, slots=True)
class Node:
    key: str
    label: str  # the key, cut to fit the box (the full key is in its tooltip)
    status: str
    attempts: int
    depth: int
    row: int
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    target_status: str
    path: str  # SVG path data


@dataclass(frozen=True, slots=True)
class Layout:
    width: int
    height: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    node_width: int = NODE_WIDTH
    node_height: int = NODE_HEIGHT


def depths(needs: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Longest-path depth of every step; a need outside the map counts as depth -1,
    and a cycle (never in a valid plan) is cut where it closes."""
    found: dict[str, int] = {}
    visiting: set[str] = set()

    def depth(key: str) -> int:
        if key in found:
            return found[key]
        if key not in needs or key in visiting:
            return -1
        visiting.add(key)
        value = 1 + max((depth(n) for n in needs[key]), default=-1)
        visiting.discard(key)
        found[key] = value
        return value

    for key in sorted(needs):
        depth(key)
    return found


def layout(steps: Mapping[str, StepLike]) -> Layout:
    """Coordinates for every step and an edge per need."""
    needs = {key: tuple(step.needs) for key, step in steps.items()}
    depth_of = depths(needs)
    columns: dict[int, list[str]] = {}
    for key in sorted(steps):
        columns.setdefault(depth_of[key], []).append(key)
    row_of: dict[str, int] = {}
    for depth in sorted(columns):
        keys = columns[depth]

        def barycentre(key: str) -> float:
            rows = [row_of[n] for n in needs[key] if n in row_of]
            return sum(rows) / len(rows) if rows else 0.0

        keys.sort(key=lambda k: (barycentre(k), k))
        for row, key in enumerate(keys):
            row_of[key] = row
    nodes = {}
    for key, step in steps.items():
        depth, row = depth_of[key], row_of[key]
        nodes[key] = Node(
            key=key,
            label=key if len(key) <= LABEL_CHARS else key[: LABEL_CHARS - 1] + "…",
            status=step.status,
            attempts=len(step.attempts),
            depth=depth,
            row=row,
            x=MARGIN + depth * (NODE_WIDTH + COLUMN_GAP),
            y=MARGIN + row * (NODE_HEIGHT + ROW_GAP),
        )
    edges = []
    for key in sorted(steps):
        target = nodes[key]
        for need in sorted(needs[key]):
            source = nodes.get(need)
            if source is not None:
                edges.append(Edge(need, key, target.status, _curve(source, target)))
    deepest = max(columns, default=0)
    tallest = max((len(keys) for keys in columns.values()), default=0)
    return Layout(
        width=2 * MARGIN + (deepest + 1) * NODE_WIDTH + deepest * COLUMN_GAP,
        height=2 * MARGIN + tallest * NODE_HEIGHT + max(tallest - 1, 0) * ROW_GAP,
        nodes=tuple(sorted(nodes.values(), key=lambda n: (n.depth, n.row))),
        edges=tuple(edges),
    )


def _curve(source: Node, target: Node) -> str:
    x1, y1 = source.x + NODE_WIDTH, source.y + NODE_HEIGHT // 2
    x2, y2 = target.x, target.y + NODE_HEIGHT // 2
    bend = (x2 - x1) // 2
    return f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"
