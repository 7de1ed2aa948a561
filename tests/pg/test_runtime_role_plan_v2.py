"""Plan v2 connected as the least-privilege roles: every scenario of
tests/api/test_plan_v2 that needs only a runtime, unchanged — parameters, outputs,
`task_inputs`/`task_definition` (read through the definer function, as a worker on the
runtime role does) and retries — with publishing as publisher-admin and
verify/rebuild as the owner."""

from __future__ import annotations

import pytest

from tests.api import test_plan_v2
from tests.pg.test_runtime_role_cycle import _scenarios

pytestmark = pytest.mark.pg

SCENARIOS = _scenarios(test_plan_v2)


@pytest.fixture
def rt(rt_owner_checks):
    return rt_owner_checks


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_plan_v2_scenario_as_runtime_role(rt, scenario):
    SCENARIOS[scenario](rt)


def test_every_plan_v2_scenario_is_reused():
    # a scenario that grew a second fixture would silently drop out of this suite
    declared = [name for name in vars(test_plan_v2) if name.startswith("test_")]
    assert sorted(declared) == sorted(SCENARIOS)
