"""The schedule phase connected as the least-privilege roles: every schedule scenario
of tests/schedules that needs only a runtime, unchanged, with publishing done as
publisher-admin, cycles (arming, fires through the admission source, skips,
retirement) and pause/resume as the runtime role, and verify/rebuild as the owner
(the runtime role may not read publications, whose records the read model folds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import qlflow
from eventstore import faults
from tests.pg.conftest import RoleSplitRuntime
from tests.pg.test_runtime_role_cycle import _scenarios
from tests.schedules import test_schedule_phase

pytestmark = pytest.mark.pg

SCENARIOS = _scenarios(test_schedule_phase)


class OwnerChecks(RoleSplitRuntime):
    OWNER_CALLS = ("verify_projections", "rebuild_projections")

    def __init__(self, runtime, publisher, owner) -> None:
        super().__init__(runtime, publisher)
        self.owner = owner

    def __getattr__(self, name: str):
        if name in self.OWNER_CALLS:
            return getattr(self.owner, name)
        return super().__getattr__(name)

    def close(self) -> None:
        super().close()
        self.owner.close()


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
def test_schedule_scenario_as_runtime_role(rt, scenario):
    SCENARIOS[scenario](rt)


def test_enough_schedule_scenarios_are_reused():
    assert len(SCENARIOS) >= 10
