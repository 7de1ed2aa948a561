"""Step timeouts connected as the least-privilege roles: every scenario of
tests/api/test_step_timeouts that needs only a runtime, unchanged — the database's
own plan check (`qlflow_plan_refusal`) builds the step's timeout into the plan it
admits, as `bind_plan` does."""

from __future__ import annotations

import pytest

from tests.api import test_step_timeouts
from tests.pg.test_runtime_role_cycle import _scenarios

pytestmark = pytest.mark.pg

SCENARIOS = _scenarios(test_step_timeouts)


@pytest.fixture
def rt(rt_owner_checks):
    return rt_owner_checks


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_step_timeout_scenario_as_runtime_role(rt, scenario):
    SCENARIOS[scenario](rt)


def test_every_step_timeout_scenario_is_reused():
    declared = [name for name in vars(test_step_timeouts) if name.startswith("test_")]
    parametrized = {"test_a_bad_step_timeout_is_refused_at_publish_with_nothing_written"}
    assert sorted(set(declared) - parametrized) == sorted(SCENARIOS)
