"""Retention seen by the least-privilege runtime role (docs/DESIGN.md, "Retention"):
the owner removes Runs; the runtime role's admission reads the tombstones, so a
removed Run's key still answers "existing" with it, its run id is refused, and a
rerun of a removed Run says it was pruned."""

from __future__ import annotations

import pytest

from domain.errors import AdmissionCollision, NotFound
from tests.rerun.support import T0
from tests.retention.support import finished_runs

pytestmark = pytest.mark.pg


def test_the_runtime_role_answers_a_removed_runs_key_from_its_tombstone(rt_owner_checks):
    rt = rt_owner_checks
    (removed, kept) = finished_runs(rt, 2, fail=frozenset({"right"}))
    assert rt.owner.retain(T0 + 500, now_ms=T0 + 10_000).run_ids == [removed]

    again = rt.start("daily", "nightly", admission_key="key-0", now_ms=T0 + 20_000)
    assert (again.status, again.run_id) == ("existing", removed)
    assert again.removed is not None and again.removed.startswith("removed by retention at")
    assert rt.inspect_admission(run_id=removed).removed == again.removed
    with pytest.raises(AdmissionCollision):
        rt.start("daily", "nightly", admission_key="key-0", params={"day": "tue"}, now_ms=T0)
    with pytest.raises(AdmissionCollision, match="removed by retention"):
        rt.start("daily", "nightly", admission_key="other", run_id=removed, now_ms=T0)
    with pytest.raises(NotFound, match="pruned by retention"):
        rt.rerun(removed, now_ms=T0 + 20_000)
    assert rt.rerun(kept, now_ms=T0 + 20_000).status == "created"  # under its source's lock
    assert rt.verify_projections().ok
