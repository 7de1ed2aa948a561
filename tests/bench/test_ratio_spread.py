"""The benches print each ratio with the spread of its rounds' own ratios: a round's
two sides met the same machine load, so the pair's ratio is what that round says."""

from __future__ import annotations

from bench import peers, python_tasks
from bench.output import paired_ratios, ratio_line


def test_each_round_is_paired_with_the_same_round_of_the_other_side():
    ours = [{"wf": 60.0}, {"wf": 30.0}, {"wf": None}, {"wf": 90.0}]
    theirs = [{"wf": 30.0}, {"wf": 30.0}, {"wf": 50.0}]
    # round 3 has no figure of ours and round 4 none of theirs: both left out
    assert paired_ratios(ours, theirs, "wf") == [2.0, 1.0]


def test_a_ratio_line_shows_the_spread_only_where_rounds_can_differ():
    assert ratio_line("x_vs_y", 1.5, [1.25, 1.75, 1.5]) == "  x_vs_y: 1.50 (rounds 1.25–1.75)"
    assert ratio_line("x_vs_y", 1.5, [1.5]) == "  x_vs_y: 1.50"


def test_the_peers_summary_prints_the_median_ratio_beside_its_rounds():
    raw = {
        "sqlite": {
            "qlflow_call": [
                {"workflows_per_s": 60.0, "cancelled_per_s": 500.0},
                {"workflows_per_s": 40.0, "cancelled_per_s": 600.0},
            ],
            "dbos": [
                {"workflows_per_s": 30.0, "cancelled_per_s": 500.0},
                {"workflows_per_s": 40.0, "cancelled_per_s": 400.0},
            ],
        }
    }
    text = peers.render(peers.summarise(raw))
    # medians 50 / 35; rounds 2.00 and 1.00
    assert "qlflow_call_workflows_per_s_vs_dbos: 1.43 (rounds 1.00–2.00)" in text
    assert "qlflow_cancel_vs_dbos: 1.22 (rounds 1.00–1.50)" in text


def test_the_python_tasks_summary_prints_the_median_ratio_beside_its_rounds():
    raw = {
        "sqlite": {
            "qlflow_thread": [{"workflows_per_s": 45.0}, {"workflows_per_s": 60.0}],
            "dbos": [{"workflows_per_s": 50.0}, {"workflows_per_s": 40.0}],
        }
    }
    text = python_tasks.render(python_tasks.summarise(raw))
    assert "qlflow_thread_vs_dbos: 1.17 (rounds 0.90–1.50)" in text


def test_four_slots_against_one_are_paired_by_round_too():
    raw = {
        "sqlite": {
            "parallel_thread/4": [
                {"workflows_per_s": 40.0, "drain_workflows_per_s": 80.0},
                {"workflows_per_s": 30.0, "drain_workflows_per_s": 60.0},
            ],
            "parallel_thread/1": [
                {"workflows_per_s": 10.0, "drain_workflows_per_s": 20.0},
                {"workflows_per_s": 10.0, "drain_workflows_per_s": 20.0},
            ],
        }
    }
    text = python_tasks.render(python_tasks.summarise(raw))
    assert "parallel_thread_4_slots_vs_1: 3.50 (rounds 3.00–4.00)" in text
    assert "parallel_thread_4_slots_vs_1_drain_only: 3.50 (rounds 3.00–4.00)" in text
