"""Step logs under least-privilege roles: the runtime writes, trims and prunes them,
the audit role reads them and writes nothing, the publisher sees none."""

from __future__ import annotations

import pytest

import qlflow
from tests.cycle.helpers import T0, manifest
from tests.pg.test_roles import refused, sql_as

pytestmark = pytest.mark.pg


def test_the_runtime_writes_logs_and_the_audit_role_reads_them(roles, rt):
    rt.publish(manifest([("a", [])]), now_ms=T0)
    run_id = rt.start("demo", "flow", now_ms=T0).run_id
    rt.cycle(now_ms=T0 + 1)
    [lease] = rt.lease_attempts("w1", now_ms=T0 + 2)
    rt.append_log(lease.attempt_id, [("stdout", T0 + 3, b"x" * (rt.log_cap_bytes + 10))])
    assert rt.logs(run_id)[-1].text.endswith("x")  # the tail trimmed as the runtime role

    with qlflow.open(roles.audit) as audit:
        assert [c.data for c in audit.logs(run_id)] == [c.data for c in rt.logs(run_id)]
        assert audit.why(run_id, now_ms=T0 + 4).status == "running"
    for statement in (
        "INSERT INTO log_chunks VALUES ('wta:x', 1, 1, 'stdout', 'x'::bytea)",
        "DELETE FROM log_chunks",
        "UPDATE log_attempts SET last_at_ms = 0",
    ):
        refused(roles.audit, statement)
    for table in ("log_chunks", "log_attempts"):
        refused(roles.publisher, f"SELECT * FROM {table}")
    assert sql_as(roles.audit, "SELECT count(*) FROM log_attempts") == [(1,)]

    pruned = rt.prune_logs(T0 + 4)
    assert pruned.attempts == 1
    assert sql_as(roles.audit, "SELECT count(*) FROM log_chunks") == [(0,)]
