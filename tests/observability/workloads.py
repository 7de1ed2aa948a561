"""A workload that makes every kind of event the metrics and the structured log
count: a lease that expires (recovery), an Attempt its host interrupts, a retry, a
schedule that fires and one that skips."""

from __future__ import annotations

from tests.cycle.helpers import DIAMOND, T0, drive, manifest
from tests.schedules.helpers import MINUTE, schedule
from tests.schedules.helpers import manifest as scheduled

TTL_MS = 5_000


def retrying_diamond(*retried: str) -> dict:
    """The diamond; step c (and each of `retried`) may be tried twice (one retry at
    once)."""
    document = manifest(DIAMOND)
    for step in document["workflows"]["flow"]["steps"]:
        if step["key"] in {"c", *retried}:
            step["retry"] = {"max_attempts": 2, "backoff_ms": 0}
    return document


def eventful(rt) -> str:
    """Run the workload on `rt`; returns the diamond's run id.

    a: its first lease expires before it starts (that Attempt is lost, a new one is
    claimed), its second Attempt is
    interrupted (worker_shutdown: it runs again), the third succeeds; c fails twice
    (one retry), so d is skipped and the Run fails. Then a schedule every hour fires
    at T0 + 1 h and skips the next occurrence, which a 2-hour outage misses."""
    rt.publish(retrying_diamond(), now_ms=T0)
    rt.publish(scheduled(schedule("0 * * * *"), package="hourly"), now_ms=T0)
    run_id = rt.start("demo", "flow", admission_key="eventful", now_ms=T0).run_id
    [lost] = rt.lease_attempts("w1", ttl_ms=TTL_MS, now_ms=T0)  # never started
    assert lost.step_key == "a"
    now = T0 + TTL_MS + 1
    rt.cycle(now_ms=now)  # recovery: the lease expired, the Attempt is lost, a new one
    [stopped] = rt.lease_attempts("w1", now_ms=now, start=True)
    assert stopped.step_key == "a"
    rt.complete(stopped, "interrupted", result_code="worker_shutdown", now_ms=now)
    now = drive(rt, now + 10, outcomes={"c": "failed"})
    assert rt.get_run(run_id).status == "failed"
    hour = (now // (60 * MINUTE) + 1) * 60 * MINUTE  # the next full hour
    rt.cycle(now_ms=hour - MINUTE)  # armed for `hour`
    rt.cycle(now_ms=hour)  # fires
    rt.cycle(now_ms=hour + 2 * 60 * MINUTE + 10 * MINUTE)  # down 2 h: skips (late)
    return run_id
