"""The expression sandbox's bounds, on its real worker processes (SPEC §15)."""

from __future__ import annotations

import time

import pytest

from orchestra.language.expressions import ExpressionError, Scope
from orchestra.language.sandbox import Bounds, Sandbox


@pytest.fixture
async def sandbox():
    box = Sandbox(Bounds(timeout_ms=2000, memory_mb=256, result_max_bytes=10_000, workers=1))
    yield box
    await box.close()


async def test_past_the_deadline_the_worker_is_replaced_and_the_error_names_the_limit(sandbox):
    began = time.perf_counter()
    with pytest.raises(ExpressionError, match=r"took longer than 2000 ms, the limit \(ORCHESTRA_EXPRESSION_TIMEOUT_MS\)"):
        await Scope({"input": list(range(16_000))}, sandbox).evaluate("input.map(x, x).size()")
    assert time.perf_counter() - began < 8
    first = sandbox._idle + list(sandbox._busy)
    assert first == []  # the timed-out worker was killed, not kept
    assert await Scope({"input": [1, 2, 3]}, sandbox).evaluate("input.map(x, x * 2)") == [2, 4, 6]


async def test_memory_and_result_size_are_bounded(sandbox):
    words = ["x" * 4000] * 1000  # 1,000 copies of 4 MB as Python strings: past 256 MiB in ~0.3 s
    # ~0.3 s on a quiet machine, past 2 s on a loaded one: a deadline that cannot come
    # first, so that the memory bound is the one reached
    roomy = Sandbox(Bounds(timeout_ms=60_000, memory_mb=256, result_max_bytes=10_000, workers=1))
    try:
        with pytest.raises(ExpressionError, match=r"needed more than 256 MiB of memory, the limit "
                                                  r"\(ORCHESTRA_EXPRESSION_MEMORY_MB\)"):
            await Scope({"input": words}, roomy).evaluate("input.map(x, input)")
    finally:
        await roomy.close()
    with pytest.raises(ExpressionError, match=r"gave \d+ bytes of JSON; the limit is 10000 "
                                              r"\(ORCHESTRA_EXPRESSION_RESULT_MAX_BYTES\)"):
        await Scope({"input": list(range(20_000))}, sandbox).evaluate("input + input")  # a large context


async def test_what_an_expression_reads_is_bounded_before_it_runs():
    box = Sandbox(Bounds(input_max_bytes=1000))
    with pytest.raises(ExpressionError, match=r"is evaluated against \d+ bytes of JSON; the limit is 1000 "
                                              r"\(ORCHESTRA_EXPRESSION_INPUT_MAX_BYTES\)"):
        await Scope({"input": "x" * 2000}, box).evaluate("size(input)")
    assert await Scope({"input": "x" * 500}, box).evaluate("size(input)") == 500
    await box.close()


async def test_close_ends_every_worker(sandbox):
    assert await Scope({"input": [1]}, sandbox).evaluate("input.exists(x, x == 1)") is True
    processes = [w.process for w in sandbox._idle]
    assert processes and all(p.returncode is None for p in processes)
    await sandbox.close()
    assert all(p.returncode is not None for p in processes)


async def test_plain_expressions_over_small_contexts_stay_inline():
    """No sandbox at all: they never need one."""
    scope = Scope({"input": {"n": 2, "tags": ["a"]}})
    assert await scope.evaluate("input.n * 2 + size(input.tags)") == 5
    with pytest.raises(ExpressionError, match="needs the engine's expression sandbox"):
        await scope.evaluate("input.tags.map(t, t)")
