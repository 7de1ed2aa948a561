"""`Runtime.workflow_params`: what a Workflow of a package's head declares, on both
stores; unknown names are NotFound."""

from __future__ import annotations

import pytest

import qlflow
from qlflow import ParamDefinition
from qlflow.errors import NotFound
from tests.ui.test_plan_v2 import manifest

T0 = 1_800_000_000_000


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def test_the_head_declares_the_params(rt):
    rt.publish(manifest(), now_ms=T0)
    assert rt.workflow_params("daily", "nightly") == [
        ParamDefinition("date", "string", None, "the <i>day</i>"),
        ParamDefinition("dry", "boolean", False),
        ParamDefinition("limit", "integer", 10),
    ]
    changed = manifest()
    del changed["workflows"]["nightly"]["params"]["dry"]
    rt.publish(changed, now_ms=T0 + 1)  # a new head: its declarations
    assert [p.name for p in rt.workflow_params("daily", "nightly")] == ["date", "limit"]


def test_unknown_package_or_workflow_is_not_found(rt):
    rt.publish(manifest(), now_ms=T0)
    with pytest.raises(NotFound, match="no published package"):
        rt.workflow_params("nope", "nightly")
    with pytest.raises(NotFound, match="has no Workflow 'other'"):
        rt.workflow_params("daily", "other")
