"""The fake OpenAI-compatible server for tests, and a `fake_llm` fixture.

Use it from any test package with `from tests.fakes.fake_llm import FakeLLM, fake_llm`
(importing the fixture into a conftest registers it). The implementation lives in
`orchestra.testing.fake_llm` so `examples/fake_llm.py` can share it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestra.testing.fake_llm import FakeLLM, RecordedRequest, ScriptedReply

__all__ = ["FakeLLM", "RecordedRequest", "ScriptedReply", "fake_llm"]


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    """A running `FakeLLM` (echo mode, no delays); `fake_llm.base_url` is its `/v1` URL."""
    with FakeLLM() as fake:
        yield fake
