"""The DAG layout and the time helpers: pure functions, checked by property."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.errors import InvalidInput
from qlflow.ui import dag, times
from qlflow.ui.data import Cursor, short_id


@dataclass(frozen=True)
class Step:
    needs: tuple[str, ...]
    status: str = "pending"
    attempts: tuple[object, ...] = field(default_factory=tuple)


@st.composite
def dags(draw) -> dict[str, Step]:
    """Up to 128 steps; an edge joins a lower index to a higher one (so it is acyclic)."""
    count = draw(st.integers(1, 128))
    pairs = draw(
        st.lists(st.tuples(st.integers(0, count - 1), st.integers(0, count - 1)), max_size=256)
    )
    needs: dict[int, set[int]] = {i: set() for i in range(count)}
    for a, b in pairs:
        if a != b:
            needs[max(a, b)].add(min(a, b))
    return {f"s{i:03d}": Step(tuple(sorted(f"s{n:03d}" for n in needs[i]))) for i in needs}


@given(dags())
def test_every_edge_points_right_and_depth_is_the_longest_path(steps):
    layout = dag.layout(steps)
    nodes = {node.key: node for node in layout.nodes}
    assert set(nodes) == set(steps)
    for key, step in steps.items():
        expected = 1 + max((nodes[n].depth for n in step.needs), default=-1)
        assert nodes[key].depth == expected
    assert len(layout.edges) == sum(len(s.needs) for s in steps.values())
    for edge in layout.edges:
        assert nodes[edge.source].x + layout.node_width < nodes[edge.target].x


@given(dags())
def test_nodes_never_overlap_and_fit_the_canvas(steps):
    layout = dag.layout(steps)
    boxes = {(node.x, node.y) for node in layout.nodes}
    assert len(boxes) == len(layout.nodes)
    for node in layout.nodes:
        assert node.x >= 0 and node.x + layout.node_width <= layout.width
        assert node.y >= 0 and node.y + layout.node_height <= layout.height
    columns: dict[int, list[int]] = {}
    for node in layout.nodes:
        columns.setdefault(node.x, []).append(node.y)
    for ys in columns.values():
        ys.sort()
        assert all(b - a >= layout.node_height for a, b in itertools.pairwise(ys))


def test_long_keys_are_cut_with_the_full_key_kept():
    long_key = "k" * 40
    (node,) = dag.layout({long_key: Step(())}).nodes
    assert node.key == long_key and len(node.label) == dag.LABEL_CHARS
    assert node.label.endswith("…")


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "-"), (0, "0ms"), (999, "999ms"), (1000, "1.0s"), (59_999, "60.0s"),
     (60_000, "1m00s"), (3_599_000, "59m59s"), (3_600_000, "1h00m"), (172_800_000, "2d00h")],
)  # fmt: skip
def test_durations(ms, text):
    assert times.duration(ms) == text


def test_relative_hints():
    assert times.relative(1_000, 62_000) == "1m01s ago"
    assert times.relative(5_000, 5_500) == "just now"
    assert times.relative(20_000, 8_000) == "in 12.0s"


def test_filter_instants():
    assert times.parse_instant("since", "") is None
    assert times.parse_instant("since", "1700000000000") == 1_700_000_000_000
    assert times.parse_instant("since", "2023-11-14T22:13:20", 0) == 1_700_000_000_000
    assert times.parse_instant("since", "2023-11-14T23:13:20", -60) == 1_700_000_000_000
    assert times.parse_instant("since", "2023-11-14T22:13:20+00:00", 300) == 1_700_000_000_000
    for bad in ("yesterday", "2023-13-01", "9" * 17):
        with pytest.raises(InvalidInput):
            times.parse_instant("since", bad)
    assert times.parse_offset("-120") == -120
    assert times.parse_offset("abc") is None and times.parse_offset("5000") is None


def test_cursors_and_short_ids():
    cursor = Cursor(1_700_000_000_000, "run:ab.cd")
    assert Cursor.parse("before", cursor.token()) == cursor
    for bad in ("", "123", "x.run", ".run"):
        with pytest.raises(InvalidInput):
            Cursor.parse("before", bad)
    assert short_id("run:0123456789abcdef") == "run:01234567"
    assert short_id("forged-1") == "forged-1"
