"""Provider clients are kept by provider, not by plaintext key: a rotated key closes the
old client (once no call streams through it) and the next step sends the new key
(issue 24: clients were kept forever, keyed by the API key)."""

from __future__ import annotations

import asyncio
import time

from orchestra.engine.llm import ChatMessage, TextDelta
from orchestra.engine.llm.clients import ProviderClients
from orchestra.engine.llm.factory import make_client
from orchestra.services import providers
from orchestra.services.agent_cache import AgentConfig
from tests.engine.conftest import LOOPBACK
from tests.engine.test_engine import setup_agent, start, wait_status, worker_step
from tests.fakes.fake_llm import FakeLLM


def chat_requests(fake: FakeLLM):
    return [r for r in fake.requests if r.path.rstrip("/").endswith("/chat/completions")]


async def closed(fake: FakeLLM, port: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port not in fake.open_client_ports():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_rotated_key_closes_the_old_client_and_the_next_step_sends_the_new_key(core, fake_llm):
    who = await setup_agent(core, fake_llm, api_key="key-before-rotation")
    run = await wait_status(core, await start(core, who, [worker_step(who)]), "succeeded", "failed")
    assert run.status == "succeeded", run.error
    first = chat_requests(fake_llm)[-1]
    assert first.headers["authorization"] == "Bearer key-before-rotation"
    assert first.client_port in fake_llm.open_client_ports()  # kept alive for the next step

    await providers.update_provider(core, provider_id=who["provider_id"], api_key="key-after-rotation")
    run = await wait_status(core, await start(core, who, [worker_step(who)]), "succeeded", "failed")
    assert run.status == "succeeded", run.error
    second = chat_requests(fake_llm)[-1]
    assert second.headers["authorization"] == "Bearer key-after-rotation"
    assert second.client_port != first.client_port
    assert await closed(fake_llm, first.client_port), "the client of the old key is still open"
    assert core.engine.agent_steps.clients.providers() == [who["provider_id"]]  # one, by provider


def config(fake: FakeLLM, key: str) -> AgentConfig:
    return AgentConfig(kind="worker", id="w", owner_id=None, name="w", system_prompt="",
                       skill_instructions=None, tools=(), provider_id="p-1",
                       provider_kind="openai_compatible", provider_base_url=fake.base_url,
                       provider_api_key=key, model="fake-model")


async def test_a_client_streaming_when_the_key_rotates_finishes_then_closes(fake_llm):
    pool = ProviderClients(lambda c: make_client(kind=c.provider_kind, api_key=c.provider_api_key,
                                                 base_url=c.provider_base_url, egress=LOOPBACK))
    try:
        old = await pool.get(config(fake_llm, "key-one"))
        fake_llm.script_text("one two three four", chunks=4, delay=0.15)
        stream = old.stream_chat(model="fake-model", messages=[ChatMessage("user", "hi")], tools=[])
        first = await anext(stream)  # the call is in flight on the old client
        port = chat_requests(fake_llm)[-1].client_port
        new = await pool.get(config(fake_llm, "key-two"))  # rotated meanwhile
        assert port in fake_llm.open_client_ports()
        rest = [event async for event in stream]
        text = "".join(e.text for e in [first, *rest] if isinstance(e, TextDelta))
        assert text == "one two three four"  # the stream in flight was not cut
        assert await closed(fake_llm, port)  # ...and its client closed once it ended
        fake_llm.script_text("again")
        events = [e async for e in old.stream_chat(model="fake-model", tools=[],
                                                   messages=[ChatMessage("user", "hi")])]
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "again"
        assert chat_requests(fake_llm)[-1].headers["authorization"] == "Bearer key-two"
        assert pool.providers() == ["p-1"]
        assert new is not old
    finally:
        await pool.close()
