"""`qlflow ui` serves the Prometheus metrics at /metrics, read from its store."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.cycle.helpers import DIAMOND, T0, manifest


def test_metrics_page_reads_the_dashboards_store(rt, client):
    rt.publish(manifest(DIAMOND), now_ms=T0)
    for i in range(3):
        rt.start("demo", "flow", admission_key=f"k{i}", now_ms=T0)
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }
    assert samples[("qlflow_runs", (("status", "running"),))] == 3
    # the client's clock is a minute after the claims
    assert samples[("qlflow_attempts_queued", (("task", "demo@1#a"),))] == 3
    assert samples[("qlflow_attempts_oldest_claim_age_seconds", (("task", "demo@1#a"),))] == 60
