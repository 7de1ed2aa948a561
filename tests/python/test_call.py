"""Calling a python Task's function once: what it returns, raises or prints becomes
an Outcome and log lines, the same in a pool process and on a thread."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from domain.json_values import MAX_OUTPUT_BYTES
from qlflow.python.call import (
    EXCEPTION,
    FAILED,
    FUNCTION_MISSING,
    IMPORT_FAILED,
    OUTPUT_INVALID,
    PROCESS_DIED,
    SUCCEEDED,
    Call,
    invoke,
)
from qlflow.python.pool import ProcessPool

MODULE = f"""
import asyncio, os

def plain(ctx):
    ctx.log.info("params %s needs %s", ctx.params, ctx.needs)
    return {{"step": ctx.step_key, "attempt": ctx.attempt, "of": ctx.max_attempts}}

def nothing(ctx):
    return None

async def later(ctx):
    await asyncio.sleep(0)
    return {{"awaited": True}}

def raises(ctx):
    raise KeyError("missing-key")

def a_list(ctx):
    return [1, 2]

def nan(ctx):
    return {{"x": [float("nan")]}}

def huge(ctx):
    return {{"x": "a" * {MAX_OUTPUT_BYTES}}}

def not_json(ctx):
    return {{"x": object()}}

def prints(ctx):
    print("printed line")
    return {{"pid": os.getpid()}}

def stops(ctx):
    return {{"stop": ctx.stop_requested()}}

def dies(ctx):
    os._exit(3)

value = 3
"""


def _folder(tmp_path: Path, body: str = MODULE, name: str = "pkg") -> Path:
    folder = tmp_path / name
    (folder / "steps").mkdir(parents=True, exist_ok=True)
    (folder / "steps" / "__init__.py").write_text("")
    (folder / "steps" / "work.py").write_text(textwrap.dedent(body))
    return folder


def _call(folder: Path, function: str, digest: str = "sha256:" + "1" * 64, module="steps.work"):
    return Call(
        folder=str(folder),
        module=module,
        function=function,
        source_digest=digest,
        params={"n": 2},
        needs={"up": {"rows": 1}},
        run_id="run:x",
        step_key="load",
        attempt=2,
        max_attempts=3,
        attempt_id="wta:x",
    )


def _invoke(call: Call, stop: bool = False):
    lines: list[tuple[str, bytes]] = []
    outcome = invoke(call, lambda stream, data: lines.append((stream, data)), lambda: stop)
    return outcome, b"".join(data for _, data in lines).decode()


def test_a_returned_dict_is_the_output_and_the_context_holds_the_step(tmp_path: Path) -> None:
    outcome, text = _invoke(_call(_folder(tmp_path), "plain"))
    assert (outcome.outcome, outcome.output) == (SUCCEEDED, {"step": "load", "attempt": 2, "of": 3})
    assert "INFO qlflow.task.load: params {'n': 2} needs {'up': {'rows': 1}}" in text


def test_none_is_no_output_and_an_async_function_is_awaited(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert _invoke(_call(folder, "nothing"))[0].outcome == SUCCEEDED
    assert _invoke(_call(folder, "nothing"))[0].output is None
    assert _invoke(_call(folder, "later"))[0].output == {"awaited": True}


def test_stop_requested_reads_the_hosts_answer(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert _invoke(_call(folder, "stops"))[0].output == {"stop": False}
    assert _invoke(_call(folder, "stops"), stop=True)[0].output == {"stop": True}


def test_an_exception_fails_with_its_type_message_and_traceback_in_the_log(
    tmp_path: Path,
) -> None:
    outcome, text = _invoke(_call(_folder(tmp_path), "raises"))
    assert (outcome.outcome, outcome.result_code) == (FAILED, EXCEPTION)
    assert outcome.message == "KeyError: 'missing-key'"
    assert "Traceback (most recent call last)" in text and 'raise KeyError("missing-key")' in text
    assert text.rstrip().endswith("qlflow: steps.work:raises raised KeyError: 'missing-key'")


@pytest.mark.parametrize(
    ("function", "reason"),
    [
        ("a_list", "returned list"),
        ("nan", "nan"),
        ("huge", "bytes"),
        ("not_json", "not JSON"),
    ],
)
def test_a_return_that_cannot_be_an_output_fails_output_invalid(
    tmp_path: Path, function: str, reason: str
) -> None:
    outcome, text = _invoke(_call(_folder(tmp_path), function))
    assert (outcome.outcome, outcome.result_code, outcome.output) == (FAILED, OUTPUT_INVALID, None)
    assert reason in (outcome.message or "") and reason in text


def test_a_missing_module_function_or_a_module_that_raises_are_named(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert _invoke(_call(folder, "absent"))[0].result_code == FUNCTION_MISSING
    assert _invoke(_call(folder, "value"))[0].result_code == FUNCTION_MISSING  # not callable
    missing, text = _invoke(_call(folder, "run", module="steps.nowhere"))
    assert missing.result_code == IMPORT_FAILED and "ModuleNotFoundError" in text
    broken = _folder(tmp_path, "raise RuntimeError('at import')\n", name="broken")
    outcome, text = _invoke(_call(broken, "run"))
    assert outcome.result_code == IMPORT_FAILED
    assert "RuntimeError: at import" in text and "Traceback" in text


def test_a_new_source_digest_imports_the_new_code(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "def run(ctx):\n    return {'v': 1}\n", name="versions")
    assert _invoke(_call(folder, "run", digest="sha256:" + "a" * 64))[0].output == {"v": 1}
    (folder / "steps" / "work.py").write_text("def run(ctx):\n    return {'v': 2}\n")
    assert _invoke(_call(folder, "run", digest="sha256:" + "a" * 64))[0].output == {"v": 1}
    assert _invoke(_call(folder, "run", digest="sha256:" + "b" * 64))[0].output == {"v": 2}


def test_a_pool_process_runs_calls_sends_prints_and_is_replaced_when_it_dies(
    tmp_path: Path,
) -> None:
    folder = _folder(tmp_path)
    pool = ProcessPool(1)
    try:
        process = pool.acquire()
        lines: list[tuple[str, bytes]] = []

        def run(function: str):
            process.start(_call(folder, function))
            while True:
                outcome = process.wait(10.0, lambda stream, data: lines.append((stream, data)))
                if outcome is not None:
                    return outcome

        first = run("prints")
        assert first.output == {"pid": process.pid} and process.pid != __import__("os").getpid()
        assert ("stdout", b"printed line\n") in lines
        assert run("raises").result_code == EXCEPTION
        assert run("prints").output == {"pid": process.pid}  # the same process, reused
        died = run("dies")
        assert (died.outcome, died.result_code) == (FAILED, PROCESS_DIED)
        assert died.message == "the pool process exited with code 3"
        pool.release(process)
        again = pool.acquire()
        assert again is not process and again.pid != process.pid
        pool.release(again)
    finally:
        pool.close()


def test_two_packages_with_a_module_of_the_same_name_each_run_their_own(tmp_path: Path) -> None:
    one = _folder(tmp_path, "def run(ctx):\n    return {'from': 'one'}\n", name="one")
    two = _folder(tmp_path, "def run(ctx):\n    return {'from': 'two'}\n", name="two")
    (two / "steps" / "__init__.py").unlink()  # a namespace package this time
    assert _invoke(_call(one, "run"))[0].output == {"from": "one"}
    assert _invoke(_call(two, "run"))[0].output == {"from": "two"}
    assert _invoke(_call(one, "run"))[0].output == {"from": "one"}


async def test_an_async_function_is_awaited_under_a_running_event_loop(tmp_path: Path) -> None:
    outcome, _ = _invoke(_call(_folder(tmp_path), "later"))
    assert outcome.output == {"awaited": True}
