"""Plan v2 connected as the least-privilege roles: every scenario of
tests/api/test_plan_v2 that needs only a runtime, unchanged — parameters, outputs,
`task_inputs`/`task_definition` (read through the definer function, as a worker on the
runtime role does) and retries — with publishing as publisher-admin and
verify/rebuild as the owner."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import qlflow
from eventstore import faults
from tests.api import test_plan_v2
from tests.pg.test_runtime_role_cycle import _scenarios
from tests.pg.test_runtime_role_schedules import OwnerChecks

pytestmark = pytest.mark.pg

SCENARIOS = _scenarios(test_plan_v2)


@pytest.fixture
def rt(roles) -> Iterator[OwnerChecks]:
    runtime = OwnerChecks(
        qlflow.open(roles.runtime), qlflow.open(roles.publisher), qlflow.open(roles.owner)
    )
    try:
        yield runtime
    finally:
        runtime.close()
        faults.disarm()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_plan_v2_scenario_as_runtime_role(rt, scenario):
    SCENARIOS[scenario](rt)


def test_every_plan_v2_scenario_is_reused():
    # a scenario that grew a second fixture would silently drop out of this suite
    declared = [name for name in vars(test_plan_v2) if name.startswith("test_")]
    assert sorted(declared) == sorted(SCENARIOS)
