"""The dashboard on both stores: a Run retention removed is a 404 page that says it
was pruned by retention and when, not a bare "not found"."""

from __future__ import annotations

from tests.rerun.support import T0
from tests.retention.support import finished_runs


def test_a_removed_run_says_it_was_pruned_by_retention(rt, client):
    (gone, kept) = finished_runs(rt, 2)
    rt.retain(T0 + 500, now_ms=T0 + 10_000)

    response = client.get(f"/runs/{gone}")

    assert response.status_code == 404
    assert "pruned by retention on 2027-01-15 08:00:10 UTC" in response.text
    assert client.get(f"/runs/{kept}").status_code == 200
