"""The schedule phase connected as the least-privilege roles: every schedule scenario
of tests/schedules that needs only a runtime, unchanged, with publishing done as
publisher-admin, cycles (arming, fires through the admission source, skips,
retirement) and pause/resume as the runtime role, and verify/rebuild as the owner
(the runtime role may not read publications, whose records the read model folds)."""

from __future__ import annotations

import pytest

from tests.pg.test_runtime_role_cycle import _scenarios
from tests.schedules import test_schedule_phase

pytestmark = pytest.mark.pg

SCENARIOS = _scenarios(test_schedule_phase)


@pytest.fixture
def rt(rt_owner_checks):
    return rt_owner_checks


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_schedule_scenario_as_runtime_role(rt, scenario):
    SCENARIOS[scenario](rt)


def test_enough_schedule_scenarios_are_reused():
    assert len(SCENARIOS) >= 10
