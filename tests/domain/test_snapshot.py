"""A snapshot of the folded aggregate reads back equal, and a fold resumed from it
equals the fold of the whole log."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.aggregate import extend
from domain.errors import CorruptionError
from domain.snapshot import aggregate_from_snapshot, snapshot_document, snapshot_versions
from domain.streams import lease_stream, run_stream, steps_stream
from tests.domain.strategies import World, chain_needs, claim, finish, make_plan, reachable_worlds
from tests.hypothesis_budget import examples


def stored(aggregate):
    """The snapshot as the store keeps it: JSON and back."""
    return orjson.loads(orjson.dumps(snapshot_document(aggregate)))


def resealed(document):
    """`document` with its digest recomputed: the checks past the digest are reached."""
    body = {key: value for key, value in document.items() if key != "digest"}
    digest = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {**body, "digest": "sha256:" + digest}


def resume_from(world: World, document):
    run_v, steps_v, leases = snapshot_versions(document)
    run_id = world.plan.run_id
    attempts = world.agg.attempts
    return extend(
        aggregate_from_snapshot(document),
        world.records(run_stream(run_id))[run_v:],
        world.records(steps_stream(run_id))[steps_v:],
        {a: world.records(lease_stream(a))[leases.get(a, 0) :] for a in attempts},
    )


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reachable_worlds(max_steps=12, max_actions=80), st.data())
def test_snapshot_round_trips_and_the_fold_resumes_from_it(world, data):
    whole = world.refold()
    assert aggregate_from_snapshot(stored(whole)) == whole
    states = [after for _, after in world.history]
    prefix = states[data.draw(st.integers(0, len(states) - 1))]
    assert resume_from(world, stored(prefix)) == whole


def test_a_document_that_does_not_check_is_corruption():
    world = World(make_plan(chain_needs(3)))
    claim(world)
    finish(world, "s000")
    good = stored(world.agg)
    edited = {**good, "steps_version": good["steps_version"] + 1}
    assert aggregate_from_snapshot(resealed(good)) == world.agg
    with pytest.raises(CorruptionError, match="digest does not match"):
        aggregate_from_snapshot(edited)
    bad = [
        {**good, "schema": "other"},
        {**good, "steps": good["steps"][1:]},
        {**good, "steps_version": -1},
        {**good, "run": {**good["run"], "extra": 1}},
        {**good, "attempts": [{**good["attempts"][0], "lease": {"lease_id": "x"}}]},
        {**good, "lease_versions": {"nobody": 1}},
        "not a document",
    ]
    for document in bad:
        with pytest.raises(CorruptionError, match="run snapshot"):
            aggregate_from_snapshot(resealed(document) if isinstance(document, dict) else document)
