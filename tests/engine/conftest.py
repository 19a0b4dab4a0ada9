"""Fixtures for the engine tests: the fake LLM server and a client bound to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from orchestra.egress import EgressPolicy
from orchestra.engine.llm.openai_compat import OpenAICompatClient
from tests.fakes.fake_llm import FakeLLM

# The fakes listen on loopback, which the egress rule refuses unless allowed.
LOOPBACK = EgressPolicy.parse("127.0.0.0/8,::1")


@pytest_asyncio.fixture
async def llm_client(fake_llm: FakeLLM) -> AsyncIterator[OpenAICompatClient]:
    """An `openai_compatible` client pointed at the running fake."""
    client = OpenAICompatClient(
        kind="openai_compatible", api_key="test-key", base_url=fake_llm.base_url, timeout=5.0,
        egress=LOOPBACK,
    )
    yield client
    await client.aclose()
