"""`/mcp` between users and credentials (SPEC §15b), in process, on both stores: one
user's handshake-era sessions are capped (the oldest closes, the newest stays open,
others' stay open); a body that is not strict JSON (NaN, Infinity, a duplicate key) is
refused as on /api/v1."""

from __future__ import annotations

import contextlib
import json

import httpx2
import mcp_types as types
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

LEGACY = "2025-06-18"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"max_mcp_sessions_per_user": 3}


def rpc(method: str, id: int | None = 1, **params) -> dict:
    message = {"jsonrpc": "2.0", "method": method, "params": params}
    return message if id is None else {**message, "id": id}


async def open_session(client, who: dict) -> str:
    opened = await client.post("/mcp", headers={**who["headers"], **ACCEPT}, json=rpc(
        "initialize", protocolVersion=LEGACY, capabilities={},
        clientInfo={"name": "test", "version": "1"}))
    assert opened.status_code == 200, opened.text
    session_id = opened.headers["mcp-session-id"]
    done = await client.post("/mcp", headers={**who["headers"], **ACCEPT, "mcp-session-id": session_id,
                                              "mcp-protocol-version": LEGACY},
                             json=rpc("notifications/initialized", id=None))
    assert done.status_code == 202, done.text
    return session_id


async def is_open(client, who: dict, session_id: str) -> bool:
    answer = await client.post("/mcp", headers={**who["headers"], **ACCEPT, "mcp-session-id": session_id,
                                                "mcp-protocol-version": LEGACY}, json=rpc("ping", id=7))
    assert answer.status_code in (200, 404), answer.text
    return answer.status_code == 200


async def test_one_users_sessions_are_capped_oldest_first(client, users):
    alice, bob = await users.make("alice"), await users.make("bob")
    bobs = await open_session(client, bob)
    alices = [await open_session(client, alice) for _ in range(5)]
    assert [await is_open(client, alice, s) for s in alices] == [False, False, True, True, True]
    assert await is_open(client, bob, bobs)  # another user's session is untouched
    newest = await open_session(client, alice)
    assert [await is_open(client, alice, s) for s in [*alices[2:], newest]] == [False, True, True, True]


@pytest.mark.parametrize("body", [
    b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": NaN}}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": Infinity}}',
    b'{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "ping"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": -Infinity}}',
])
async def test_a_body_that_is_not_strict_json_is_refused(client, users, body):
    alice = await users.make("alice")
    answer = await client.post("/mcp", headers={**alice["headers"], **ACCEPT}, content=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["jsonrpc"] == "2.0" and error["id"] is None and error["error"]["code"] == -32700
    assert error["error"]["message"].startswith("Parse error: The request body")
    # the same message, strictly written, is served
    fine = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert (await client.post("/mcp", headers={**alice["headers"], **ACCEPT}, content=fine)).status_code == 200


FORM = [{"id": "ask", "agent": {"human": True}, "prompt": "Approve?",
         "output_schema": {"type": "object", "properties": {"approved": {"type": "boolean"}},
                           "required": ["approved"]}}]


@contextlib.asynccontextmanager
async def sdk_client(client, token: str):
    """The official SDK's client (2026-07-28) on the in-process app."""
    async def never(context, params):  # declares elicitation; the test answers by hand
        raise AssertionError("the rounds are driven by hand here")

    transport = httpx2.ASGITransport(app=client.app, client=("127.0.0.1", 50001))
    async with httpx2.AsyncClient(transport=transport, base_url="http://orchestra.test", timeout=30,
                                  headers={"Authorization": f"Bearer {token}"}) as http:
        stream = streamable_http_client("http://orchestra.test/mcp", http_client=http)
        async with Client(stream, elicitation_callback=never, cache=None) as mcp:
            yield mcp


async def make_key(client, who: dict, scopes: list[str]) -> str:
    made = await client.post("/api/v1/auth/key", headers=who["headers"], json={"name": "k", "scopes": scopes})
    assert made.status_code == 201, made.text
    return made.json()["key"]


async def test_a_request_state_answers_only_with_the_credential_that_received_it(client, users):
    alice = await users.make("alice")
    made = await client.post("/api/v1/workflow/template", headers=alice["headers"], json={
        "name": "approve", "steps": FORM, "output": "steps.ask.output", "expose": {"mcp": True}})
    assert made.status_code == 201, made.text
    asker = await make_key(client, alice, ["run:start", "run:reply", "run:read"])
    other_key = await make_key(client, alice, ["run:start", "run:reply"])
    no_reply = await make_key(client, alice, ["run:start"])
    async with sdk_client(client, asker) as mcp:
        first = await mcp.session.call_tool("approve", {"input": "x"}, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first
    (name, _request), = first.input_requests.items()
    answer = {name: types.ElicitResult(action="accept", content={"approved": True})}

    for token in (no_reply, other_key, alice["access_token"]):  # the same user, other credentials
        async with sdk_client(client, token) as mcp:
            with pytest.raises(MCPError, match="requestState"):
                await mcp.session.call_tool("approve", {"input": "x"}, input_responses=answer,
                                            request_state=first.request_state, allow_input_required=True)
    runs = (await client.get("/api/v1/workflow/run", headers=alice["headers"])).json()["runs"]
    assert [r["status"] for r in runs] == ["waiting_reply"]  # nobody else answered it

    # a key without run:reply is never asked: it is told how to reply, and the run waits
    async with sdk_client(client, no_reply) as mcp:
        told = await mcp.session.call_tool("approve", {"input": "y"}, allow_input_required=True)
    assert isinstance(told, types.CallToolResult) and told.is_error, told
    assert "/api/v1/workflow/reply/" in told.content[0].text

    async with sdk_client(client, asker) as mcp:
        done = await mcp.session.call_tool("approve", {"input": "x"}, input_responses=answer,
                                           request_state=first.request_state)
    assert done.structured_content == {"approved": True}
    for run in (await client.get("/api/v1/workflow/run", headers=alice["headers"])).json()["runs"]:
        if run["status"] == "waiting_reply":
            await client.post(f"/api/v1/workflow/cancel/{run['trace_id']}", headers=alice["headers"])
