"""The public surface of `qlflow`: the async facade mirrors the Runtime method for
method, every value the API returns is importable from `qlflow` with a docstring,
and arguments the domain checks are refused with the domain's own error."""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path

import pytest

import qlflow
from domain.lease_terms import check_lease_ttl
from qlflow.errors import InvalidInput
from tests.cycle.helpers import T0, manifest

PUBLIC_METHODS = sorted(
    name
    for name in dir(qlflow.Runtime)
    if not name.startswith("_") and inspect.isfunction(getattr(qlflow.Runtime, name))
)


@pytest.mark.parametrize("name", PUBLIC_METHODS)
def test_every_runtime_method_has_a_coroutine_with_its_signature_and_docstring(name):
    sync = getattr(qlflow.Runtime, name)
    coroutine = vars(qlflow.AsyncRuntime).get(name)
    assert coroutine is not None, f"AsyncRuntime has no {name}"
    assert inspect.iscoroutinefunction(coroutine), name
    sync_signature, async_signature = inspect.signature(sync), inspect.signature(coroutine)
    assert [(p.name, p.kind, p.default) for p in sync_signature.parameters.values()] == [
        (p.name, p.kind, p.default) for p in async_signature.parameters.values()
    ]
    assert typing.get_type_hints(sync) == typing.get_type_hints(coroutine)
    assert inspect.getdoc(coroutine) == inspect.getdoc(sync) != None  # noqa: E711


def _named_types(hint: object) -> set[type]:
    """The classes a return annotation names (list[X] -> X, X | None -> X)."""
    if hint is None or hint is type(None):
        return set()
    origin = typing.get_origin(hint)
    if origin is None:
        return {hint} if isinstance(hint, type) else set()
    found: set[type] = set()
    for argument in typing.get_args(hint):
        found |= _named_types(argument)
    if origin not in (list, dict, typing.Union, types.UnionType):
        found.add(origin)
    return found


def test_every_returned_type_is_exported_from_qlflow_with_a_docstring():
    exported = {getattr(qlflow, name) for name in qlflow.__all__}
    returned: set[type] = set()
    for name in PUBLIC_METHODS:
        returned |= _named_types(typing.get_type_hints(getattr(qlflow.Runtime, name))["return"])
    returned -= {bool, int, str}
    assert returned, "the Runtime's methods are annotated"
    assert returned <= exported, sorted(t.__name__ for t in returned - exported)
    for value in exported:
        if isinstance(value, type):
            assert value.__doc__ and value.__doc__.strip(), value


def test_the_package_declares_its_types():
    assert (Path(qlflow.__file__).parent / "py.typed").is_file()


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        runtime.publish(manifest([("a", [])]), now_ms=T0)
        yield runtime


@pytest.mark.parametrize("ttl_ms", [4_999, 600_001, True, "30000"])
def test_a_bad_lease_ttl_is_refused_by_the_domain_even_with_nothing_to_lease(rt, ttl_ms):
    with pytest.raises(InvalidInput) as expected:
        check_lease_ttl(ttl_ms)
    with pytest.raises(InvalidInput) as caught:
        rt.lease_attempts("w1", ttl_ms=ttl_ms, now_ms=T0)
    assert (caught.value.field, caught.value.rule) == (expected.value.field, expected.value.rule)


def test_a_bad_cancel_reason_is_the_domains_refusal_and_writes_nothing(rt):
    run_id = rt.start("demo", "flow", now_ms=T0).run_id
    before = rt.store.head_position()
    with pytest.raises(InvalidInput) as caught:
        rt.cancel(run_id, reason="bored", now_ms=T0 + 1)
    assert caught.value.field == "reason"
    assert "bored" in str(caught.value)
    assert rt.store.head_position() == before
    assert rt.get_run(run_id).cancel_reason is None


def test_a_bad_renewal_ttl_and_outcome_are_the_domains_refusals(rt):
    rt.start("demo", "flow", now_ms=T0)
    rt.cycle(now_ms=T0 + 1)
    [lease] = rt.lease_attempts("w1", now_ms=T0 + 2)
    lease = rt.mark_running(lease, now_ms=T0 + 3)
    before = rt.store.head_position()
    with pytest.raises(InvalidInput) as renewal:
        rt.renew(lease, ttl_ms=1, now_ms=T0 + 4)
    assert renewal.value.field == "ttl_ms"
    for output in ([1, 2], "text"):
        with pytest.raises(InvalidInput) as refused:
            rt.complete(lease, "succeeded", output=output, now_ms=T0 + 5)  # type: ignore[arg-type]
        assert refused.value.field == "output"
    with pytest.raises(InvalidInput) as outcome:
        rt.complete(lease, "maybe", now_ms=T0 + 5)
    assert outcome.value.field == "outcome"
    assert rt.store.head_position() == before
    assert rt.complete(lease, "succeeded", output={"n": 1}, now_ms=T0 + 6) == "succeeded"


async def test_the_async_facade_answers_as_the_runtime_does(store_url):
    async with await qlflow.open_async(store_url) as rt:
        await rt.publish(manifest([("a", [])]), now_ms=T0)
        receipt = await rt.start("demo", "flow", admission_key="k", now_ms=T0)
        await rt.cycle(now_ms=T0 + 1)
        [lease] = await rt.lease_attempts("w1", now_ms=T0 + 2)
        await rt.mark_running(lease, now_ms=T0 + 3)
        assert await rt.complete(lease, "succeeded", now_ms=T0 + 4) == "succeeded"
        await rt.cycle(now_ms=T0 + 5)
        view = await rt.get_run(receipt.run_id)
        assert view == rt.runtime.get_run(receipt.run_id)
        assert view.status == "succeeded"
        assert await rt.events(receipt.run_id) == rt.runtime.events(receipt.run_id)
        assert (await rt.why(receipt.run_id, now_ms=T0 + 6)).terminal
        found = await rt.inspect_admission(admission_key="k")
        assert found == rt.runtime.inspect_admission(admission_key="k")
        assert found is not None and found.run_id == receipt.run_id
