"""The egress rule at run time (SPEC §14), on the fake model and a real MCP server on
loopback: a model call the rule refuses fails the step with a sentence naming the rule
and the setting (not retried, nothing sent); an MCP tool call it refuses is a tool error
the model reads, and the step goes on."""

from __future__ import annotations

import dataclasses

import pytest

from orchestra.engine.tools import wire_name
from orchestra.services import agents, auth, providers
from orchestra.services import mcp as mcp_service
from tests.engine.test_engine import events, start, wait_status, worker_step
from tests.fakes.fake_llm import FakeLLM

SETTING = "ORCHESTRA_EGRESS_ALLOW"
STEP_SETTING = "ORCHESTRA_STEP_EGRESS_ALLOW"


@pytest.fixture
def settings_overrides(fake_llm):
    """The running server allows the fake model's address and port only."""
    port = fake_llm.base_url.split(":")[2].split("/")[0]
    return {"egress_allow": f"127.0.0.1:{port}"}


def allowing(core, allow: str):
    return dataclasses.replace(core, settings=dataclasses.replace(core.settings, egress_allow=allow))


async def agent(core, fake: FakeLLM, base_url: str, tools: tuple[str, ...] = ()) -> dict:
    user = await auth.register(core, user_name="alice", password="password-123")
    provider = await providers.create_provider(
        allowing(core, "127.0.0.0/8"), name="fake", kind="openai_compatible", model_id="fake-model",
        api_key="test-key", base_url=base_url)
    worker = await agents.create_worker(core, owner_id=user.id, name="helper", provider_id=provider.id,
                                        tools=list(tools), system_prompt="You help.")
    core.engine.agent_steps.retry_base_delay = 0.01
    return {"user_id": user.id, "worker_id": worker.id, "provider_id": provider.id}


async def test_a_model_call_the_rule_refuses_fails_the_step(core, fake_llm):
    elsewhere = fake_llm.base_url.replace("127.0.0.1", "127.0.0.2")  # loopback, not allowed
    who = await agent(core, fake_llm, elsewhere)
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "failed"
    assert "egress rule" in run.error and SETTING in run.error and "127.0.0.2" in run.error
    assert fake_llm.chat_requests == []


async def test_an_mcp_call_the_rule_refuses_is_a_tool_error(core, fake_llm, fake_mcp):
    await mcp_service.create_server(allowing(core, "127.0.0.0/8"), name="fake", transport="streamable_http",
                                    url=fake_mcp.url)
    before = fake_mcp.stats().get("connects", 0)
    who = await agent(core, fake_llm, fake_llm.base_url, tools=("fake.echo",))
    fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "hello"})
    fake_llm.script_text("Could not.")
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded", run.error
    out = [e.data for e in await events(core, trace_id) if e.kind == "tool_result"]
    assert out[0]["result"] is None and "egress rule" in out[0]["error"] and SETTING in out[0]["error"]
    assert fake_mcp.stats().get("connects", 0) == before  # never reached


async def test_the_providers_allowance_does_not_open_the_model_server_to_http_steps(core, fake_llm):
    """SPEC §15b: with only ORCHESTRA_EGRESS_ALLOW naming the model server (the README's
    quick start), a user's HTTP step posting to it fails naming the users' setting, and
    the model server sees nothing."""
    assert core.settings.step_egress_allow == ""
    user = await auth.register(core, user_name="mallory", password="password-123")
    before = len(fake_llm.requests)
    trace_id = await start(core, {"user_id": user.id}, [{"id": "free", "http": {
        "method": "POST", "url": fake_llm.base_url + "/chat/completions",
        "body": {"model": "fake-model", "messages": [{"role": "user", "content": "free tokens"}]}}}])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "failed"
    assert "egress rule" in run.error and STEP_SETTING in run.error and "127.0.0.1" in run.error, run.error
    assert "ORCHESTRA_EGRESS_ALLOW" not in run.error.replace(STEP_SETTING, "")
    assert len(fake_llm.requests) == before


async def test_the_providers_allowance_does_not_open_the_model_server_to_subscriptions(core, fake_llm):
    from orchestra.errors import ValidationError
    from orchestra.services import subscriptions

    user = await auth.register(core, user_name="mallory", password="password-123")
    with pytest.raises(ValidationError) as refused:
        await subscriptions.create_subscription(core, user_id=user.id, url=fake_llm.base_url + "/chat/completions",
                                                events=["run.failed"], template_id=None)
    assert STEP_SETTING in str(refused.value) and refused.value.detail[0]["setting"] == STEP_SETTING
