"""orchestra as an MCP server (SPEC §14), driven by real MCP clients against real
`orchestra serve` processes: the official SDK's client (both protocol eras) lists, calls
and reads structured output, answers a human step by elicitation, hears list changes;
two processes on one PostgreSQL database serve one call's rounds between them."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
import mcp_types as types

from orchestra.testing.fake_llm import ScriptedReply
from tests.e2e.test_scale_out import Pair
from tests.e2e.test_workflow_e2e import login
from tests.fakes.fake_llm import FakeLLM

EXPOSE = {"expose": {"mcp": True}}


@contextlib.asynccontextmanager
async def mcp_client(base_url: str, token: str, *, mode: str = "auto", elicit=None, **kwargs):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
        async with Client(transport, mode=mode, elicitation_callback=elicit, cache=None, **kwargs) as client:
            yield client


def api(server, headers) -> httpx.Client:
    return httpx.Client(base_url=f"{server.base_url}/api/v1", headers=headers, timeout=30)


def make_template(http: httpx.Client, name: str, steps: list[dict], **extra) -> str:
    made = http.post("/workflow/template", json={"name": name, "steps": steps, **extra})
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


HUMAN = [{"id": "ask", "agent": {"human": True}, "prompt": "Approve {{input}}?"}]
FORM = [{"id": "ask", "agent": {"human": True}, "prompt": "Approve?",
         "output_schema": {"type": "object", "properties": {"approved": {"type": "boolean"}},
                           "required": ["approved"]}}]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_sdk_client_lists_calls_and_answers_a_human_step(server, mode):
    headers = login(server, "mcp-user", "USER")
    http = api(server, headers)
    make_template(http, "Triage ticket!", HUMAN, **EXPOSE)
    make_template(http, "hidden", HUMAN)  # not exposed: never listed
    make_template(http, "Structured", FORM, output="steps.ask.output",
                  output_schema={"type": "object", "properties": {"approved": {"type": "boolean"}}}, **EXPOSE)
    token = headers["Authorization"].split()[1]
    asked: list[str] = []

    async def elicit(context, params):
        asked.append(params.message)
        if "approved" in (params.requested_schema.get("properties") or {}):
            return types.ElicitResult(action="accept", content={"approved": True})
        return types.ElicitResult(action="accept", content={"answer": "yes, ship it"})

    async def go():
        async with mcp_client(server.base_url, token, mode=mode, elicit=elicit) as client:
            tools = (await client.list_tools()).tools
            assert sorted(t.name for t in tools) == ["Structured", "Triage_ticket"]
            triage = next(t for t in tools if t.name == "Triage_ticket")
            assert triage.input_schema["properties"]["input"]["type"] == "string"
            structured = next(t for t in tools if t.name == "Structured")
            assert structured.output_schema["properties"]["approved"] == {"type": "boolean"}
            answer = await client.call_tool("Triage_ticket", {"input": "ticket 42"})
            assert not answer.is_error, answer
            assert answer.content[0].text == "yes, ship it"
            assert "Approve ticket 42?" in asked[0]
            answer = await client.call_tool("Structured", {"input": "x"})
            assert not answer.is_error, answer
            assert answer.structured_content == {"approved": True}

    asyncio.run(go())
    runs = http.get("/workflow/run").json()
    assert {r["status"] for r in runs["runs"]} == {"succeeded"}
