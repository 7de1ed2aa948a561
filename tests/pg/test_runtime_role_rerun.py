"""Reruns connected as the least-privilege roles: every scenario of tests/rerun that
needs only a runtime, unchanged (reuse, lineage, exactly once, plan same and head, the
start guard, bad input), with publishing as publisher-admin and verify/rebuild as the
owner."""

from __future__ import annotations

import pytest

from tests.pg.test_runtime_role_cycle import _scenarios
from tests.rerun import test_rerun

pytestmark = pytest.mark.pg

SCENARIOS = _scenarios(test_rerun)


@pytest.fixture
def rt(rt_owner_checks):
    return rt_owner_checks


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rerun_scenario_as_runtime_role(rt, scenario):
    SCENARIOS[scenario](rt)


def test_every_rerun_scenario_is_reused():
    # a scenario that grew a second fixture would silently drop out of this suite
    declared = [name for name in vars(test_rerun) if name.startswith("test_")]
    assert sorted(declared) == sorted(SCENARIOS)
