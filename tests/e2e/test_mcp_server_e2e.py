"""orchestra as an MCP server (SPEC §14), driven by real MCP clients against real
`orchestra serve` processes: the official SDK's client (both protocol eras) lists, calls
and reads structured output, answers a human step by elicitation, hears list changes;
two processes on one PostgreSQL database serve one call's rounds between them."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from orchestra.testing.fake_llm import ScriptedReply
from tests.conftest import ServerProcess
from tests.e2e.test_scale_out import Pair
from tests.e2e.test_workflow_e2e import fake_worker, login
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


@pytest.fixture
def live(tmp_path):
    """A server process and a fake model."""
    with FakeLLM() as fake:
        server = ServerProcess(tmp_path / "home").start()
        try:
            yield server, fake
        finally:
            server.stop()


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


def test_the_independent_fastmcp_client_calls_with_progress_and_elicitation(live):
    """fastmcp's own `Client` (PyPI `fastmcp-slim`): structured output of a two-step agent
    template, one progress notification per finished step, then a human step answered
    through its elicitation handler."""
    from fastmcp import Client as FastClient
    from fastmcp.client.transports import StreamableHttpTransport

    server, fake = live
    headers = login(server, "fast-user", "ADMINISTRATOR")
    http = api(server, headers)
    worker = fake_worker(http, fake)
    make_template(http, "Research company", [
        {"id": "facts", "agent": {"worker": worker}, "prompt": "facts about {{input.company}}"},
        {"id": "summary", "agent": {"worker": worker}, "prompt": "summary {{steps.facts.output}}",
         "depends_on": ["facts"]},
        {"id": "each", "foreach": {"items": "['x', 'y']"}, "agent": {"worker": worker},
         "prompt": "item {{item}}", "depends_on": ["summary"]}],
        input_schema={"type": "object", "properties": {"company": {"type": "string"}}, "required": ["company"]},
        output='{"company": input.company, "summary": steps.summary.output}',
        output_schema={"type": "object", "required": ["company", "summary"],
                       "properties": {"company": {"type": "string"}, "summary": {"type": "string"}}},
        **EXPOSE)
    make_template(http, "approve", FORM, output="steps.ask.output.approved", **EXPOSE)
    fake.script(ScriptedReply(text="F"), ScriptedReply(text="S"))
    progress: list[tuple[float, str | None]] = []
    asked: list[str] = []

    async def on_progress(value, total, message):
        progress.append((value, message))

    async def on_elicit(message, response_type, params, context):
        asked.append(message)
        return {"approved": False}

    async def go():
        transport = StreamableHttpTransport(f"{server.base_url}/mcp", headers=headers)
        async with FastClient(transport, elicitation_handler=on_elicit, timeout=60) as client:
            tools = {t.name: t for t in await client.list_tools()}
            assert set(tools) == {"Research_company", "approve"}
            assert tools["Research_company"].input_schema["required"] == ["company"]
            assert tools["Research_company"].output_schema["required"] == ["company", "summary"]
            result = await client.call_tool("Research_company", {"company": "acme"},
                                            progress_handler=on_progress)
            assert result.structured_content == {"company": "acme", "summary": "S"}
            assert result.is_error is False
            result = await client.call_tool("approve", {"input": "x"})
            assert result.structured_content == {"result": False}

    asyncio.run(go())
    assert [p for p, _ in progress] == [1, 2, 3]  # top-level steps only: not the map's items
    assert [m for _, m in progress] == ["step facts finished", "step summary finished", "step each finished"]
    assert asked and "Approve?" in asked[0]
    prompts = [body["messages"][-1]["content"] for body in fake.chat_requests]
    assert prompts[:2] == ["facts about acme", "summary F"] and sorted(prompts[2:]) == ["item x", "item y"]


def test_auth_keys_and_who_sees_which_tool(server):
    admin = login(server, "admin-user", "ADMINISTRATOR")
    alice = login(server, "alice", "USER")
    bob = login(server, "bobby", "USER")
    a_http, b_http = api(server, alice), api(server, admin)
    mine = make_template(a_http, "alice tool", HUMAN, **EXPOSE)
    other = make_template(a_http, "alice-other", HUMAN, **EXPOSE)
    make_template(b_http, "shared tool", HUMAN, shared=True, **EXPOSE)
    make_template(b_http, "admin private", HUMAN, **EXPOSE)

    raw = httpx.post(f"{server.base_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert raw.status_code == 401
    assert raw.json()["error"] == "AuthenticationRequiredError"

    def names(token: str) -> list[str]:
        async def go():
            async with mcp_client(server.base_url, token) as client:
                return sorted(t.name for t in (await client.list_tools()).tools)
        return asyncio.run(go())

    token = lambda headers: headers["Authorization"].split()[1]  # noqa: E731
    assert names(token(alice)) == ["alice-other", "alice_tool", "shared_tool"]
    assert names(token(bob)) == ["shared_tool"]
    assert names(token(admin)) == ["admin_private", "shared_tool"]  # not alice's private ones

    narrowed = a_http.post("/auth/key", json={"name": "one", "scopes": ["run:start"], "templates": [mine]})
    assert narrowed.status_code == 201, narrowed.text
    assert names(narrowed.json()["key"]) == ["alice_tool"]
    reader = a_http.post("/auth/key", json={"name": "reader", "scopes": ["run:read"]}).json()["key"]
    refused = httpx.post(f"{server.base_url}/mcp", headers={"Authorization": f"Bearer {reader}"},
                         json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert refused.status_code == 403 and "run:start" in refused.json()["message"]
    assert other  # listed above under its own name


def test_a_client_that_cannot_be_asked_gets_the_trace_id_and_the_run_waits(server):
    headers = login(server, "asker", "USER")
    http = api(server, headers)
    make_template(http, "ask me", HUMAN, **EXPOSE)

    async def go():
        async with mcp_client(server.base_url, headers["Authorization"].split()[1]) as client:
            return await client.call_tool("ask_me", {"input": "it"})

    result = asyncio.run(go())
    assert result.is_error
    text = result.content[0].text
    (run,) = http.get("/workflow/run").json()["runs"]
    assert run["status"] == "waiting_reply"
    assert run["trace_id"] in text and f"/api/v1/workflow/reply/{run['trace_id']}" in text
    replied = http.post(f"/workflow/reply/{run['trace_id']}", json={"content": "later"})
    assert replied.status_code == 200, replied.text


def test_a_failed_run_is_an_error_result_naming_the_run(server):
    headers = login(server, "failing", "USER")
    http = api(server, headers)
    make_template(http, "strict", HUMAN, output="steps.ask.output", **EXPOSE,
                  output_schema={"type": "integer"})

    async def elicit(context, params):
        return types.ElicitResult(action="accept", content={"answer": "not a number"})

    async def go():
        async with mcp_client(server.base_url, headers["Authorization"].split()[1], elicit=elicit) as client:
            return await client.call_tool("strict", {"input": "x"})

    result = asyncio.run(go())
    (run,) = http.get("/workflow/run").json()["runs"]
    assert run["status"] == "failed"

    async def unknown():
        async with mcp_client(server.base_url, headers["Authorization"].split()[1]) as client:
            with pytest.raises(MCPError, match="No tool is named 'nope'"):
                await client.call_tool("nope", {})
            bad = await client.call_tool("strict", {"input": 3})  # arguments the tool refuses
            assert bad.is_error and "input" in bad.content[0].text

    asyncio.run(unknown())
    assert len(http.get("/workflow/run").json()["runs"]) == 1  # neither started a run
    assert result.is_error and run["trace_id"] in result.content[0].text
    assert "output_schema" in result.content[0].text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_template_changes_reach_open_sessions_as_list_changed(server, mode):
    headers = login(server, "lister", "USER")
    http = api(server, headers)
    make_template(http, "first", HUMAN, **EXPOSE)
    heard = asyncio.Event()

    async def on_message(message):
        if "tools/list_changed" in str(message):
            heard.set()

    async def go():
        async with mcp_client(server.base_url, headers["Authorization"].split()[1], mode=mode,
                              message_handler=on_message) as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["first"]
            if mode == "auto":
                async with client.listen(tools_list_changed=True) as sub:
                    await asyncio.to_thread(make_template, http, "second", HUMAN, **EXPOSE)
                    event = await asyncio.wait_for(sub.__anext__(), 10)
                    assert "ToolsListChanged" in type(event).__name__
            else:
                await asyncio.sleep(0.5)  # the session's stream is open
                await asyncio.to_thread(make_template, http, "second", HUMAN, **EXPOSE)
                await asyncio.wait_for(heard.wait(), 10)
            assert [t.name for t in (await client.list_tools()).tools] == ["first", "second"]

    asyncio.run(go())


def test_two_processes_serve_one_call_between_them(tmp_path, postgres_url):
    """2026-07-28: the call starts on A and asks; its retry with the answer goes to B,
    which opens A's sealed requestState, answers, and returns the output."""
    with FakeLLM() as fake:
        pair = Pair(tmp_path, postgres_url, fake)
        try:
            make_template(pair.http_a, "two hosts", FORM, output="steps.ask.output", **EXPOSE)
            token = pair.headers["Authorization"].split()[1]

            async def never(context, params):  # declares elicitation; the test answers itself
                raise AssertionError("the rounds are driven by hand here")

            async def go():
                async with mcp_client(pair.a.base_url, token, elicit=never) as on_a:
                    first = await on_a.session.call_tool("two_hosts", {"input": "x"},
                                                         allow_input_required=True)
                assert isinstance(first, types.InputRequiredResult), first
                (key, request), = first.input_requests.items()
                assert "Approve?" in request.params.message
                answer = {key: types.ElicitResult(action="accept", content={"approved": True})}
                async with mcp_client(pair.b.base_url, token, elicit=never) as on_b:
                    with pytest.raises(MCPError, match="requestState"):
                        await on_b.session.call_tool(
                            "two_hosts", {"input": "x"}, input_responses=answer,
                            request_state=first.request_state[:-4] + "AAAA", allow_input_required=True)

            asyncio.run(go())

            async def honest():
                async with mcp_client(pair.a.base_url, token, elicit=never) as on_a:
                    first = await on_a.session.call_tool("two_hosts", {"input": "y"},
                                                         allow_input_required=True)
                (key, _), = first.input_requests.items()
                answer = {key: types.ElicitResult(action="accept", content={"approved": True})}
                async with mcp_client(pair.b.base_url, token, elicit=never) as on_b:
                    return await on_b.session.call_tool("two_hosts", {"input": "y"}, input_responses=answer,
                                                        request_state=first.request_state)

            done = asyncio.run(honest())
            assert done.structured_content == {"approved": True}
            statuses = sorted(r["status"] for r in pair.http_b.get("/workflow/run").json()["runs"])
            assert statuses == ["succeeded", "waiting_reply"]  # the forged retry answered nothing
        finally:
            pair.stop()


def test_a_child_runs_question_is_asked_and_answered_on_the_childs_trace(server):
    headers = login(server, "parenting", "USER")
    http = api(server, headers)
    make_template(http, "leaf", FORM, output="steps.ask.output")
    make_template(http, "parent", [{"id": "call", "workflow": {"template": "leaf", "input": "input"}}],
                  output="steps.call.output", **EXPOSE)
    asked: list[str] = []

    async def elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approved": True})

    async def go():
        async with mcp_client(server.base_url, headers["Authorization"].split()[1], elicit=elicit) as client:
            return await client.call_tool("parent", {"input": "x"})

    result = asyncio.run(go())
    assert not result.is_error, result
    assert result.structured_content == {"approved": True}
    runs = {r["template_name"]: r for r in http.get("/workflow/run").json()["runs"]}
    assert runs["parent"]["status"] == runs["leaf"]["status"] == "succeeded"
    assert runs["leaf"]["trace_id"] in asked[0]  # the question names the run it belongs to
    leaf = http.get(f"/workflow/run/{runs['leaf']['trace_id']}").json()
    assert leaf["steps"][0]["output"] == {"approved": True}


def test_the_docs_mcp_client_snippet_runs_as_written(live, tmp_path):
    """docs/api.md's SDK snippet, run as a program with only its URL and TOKEN set: an
    API key with run:start sent as the bearer header lists the tool and calls it."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    server, fake = live
    headers = login(server, "snippet-user", "ADMINISTRATOR")
    http = api(server, headers)
    worker = fake_worker(http, fake)
    make_template(http, "Triage ticket", [{"id": "route", "agent": {"worker": worker}, "prompt": "route {{input.ticket}}"}],
                  input_schema={"type": "object", "properties": {"ticket": {"type": "string"}}, "required": ["ticket"]},
                  output="steps.route.output", **EXPOSE)
    key = http.post("/auth/key", json={"name": "snippet", "scopes": ["run:start"]})
    assert key.status_code == 201, key.text
    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", docs, re.S) if "streamable_http_client" in b]
    program = re.sub(r'^URL = ".*"$', f'URL = "{server.base_url}/mcp"', snippet, count=1, flags=re.M)
    program = re.sub(r'^TOKEN = ".*?"', f'TOKEN = "{key.json()["key"]}"', program, count=1, flags=re.M)
    assert program.count(server.base_url) == 1 and key.json()["key"] in program
    (tmp_path / "client.py").write_text(program)
    done = subprocess.run([sys.executable, str(tmp_path / "client.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "tools: Triage_ticket", "output: Echo: route The printer is on fire"], done.stdout
