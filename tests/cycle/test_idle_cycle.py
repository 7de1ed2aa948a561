"""An idle cycle: one read asks every phase whether it has work, and a cycle whose
only work is in a late phase still finds it."""

from __future__ import annotations

import qlflow
from tests.cycle.helpers import T0, manifest

TTL_MS = 5_000


class _Reads:
    """Counts the store's reads outside transactions (`query` and `query_all`)."""

    def __init__(self, store) -> None:
        self.calls: list[str] = []
        query, query_all = store.query, store.query_all
        store.query = lambda *a, **k: (self.calls.append("query"), query(*a, **k))[1]
        store.query_all = lambda *a, **k: (self.calls.append("query_all"), query_all(*a, **k))[1]


def test_an_idle_cycle_is_one_read_and_work_in_a_late_phase_is_found(store_url):
    with qlflow.open(store_url) as rt:
        rt.publish(manifest([("a", []), ("b", ["a"])]), now_ms=T0)
        run_id = rt.start("demo", "flow", now_ms=T0).run_id
        [lease] = rt.lease_attempts("w1", limit=1, ttl_ms=TTL_MS, now_ms=T0 + 1)
        reads = _Reads(rt.store)
        # the lease is live and nothing else is due: nothing to do, in one read
        idle = rt.cycle(now_ms=T0 + 2)
        assert not idle.changed and not idle.recovery.scanned
        assert reads.calls == ["query_all"]
        # the lease ran out: only recovery has work, and the cycle does it
        reads.calls.clear()
        busy = rt.cycle(now_ms=lease.expires_at_ms + 1)
        assert busy.recovery.changed == 1 and busy.changed
        assert reads.calls[0] == "query_all" and len(reads.calls) > 1
        run = rt.get_run(run_id)
        assert run.steps["a"].status == "ready"  # requeued: nothing started
