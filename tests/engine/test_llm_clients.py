"""LLM clients against the fake OpenAI-compatible server, plus retries and conversions."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import anthropic
import httpx2
import pytest

from orchestra.engine.llm import (
    SUPPORTED_KINDS,
    ChatMessage,
    ChatResult,
    LLMError,
    TextDelta,
    ToolCall,
    ToolCallsReady,
    ToolSpec,
    Usage,
    collect,
    make_client,
    with_retries,
)
from orchestra.engine.llm.anthropic import (
    AnthropicClient,
    map_anthropic_error,
    to_anthropic_messages,
    to_anthropic_system,
    to_anthropic_tools,
)
from orchestra.engine.llm.openai_compat import (
    DEFAULT_BASE_URLS,
    OpenAICompatClient,
    parse_arguments,
    to_openai_messages,
)
from orchestra.engine.llm.retry import backoff_delay, retry_after_from_headers
from tests.engine.conftest import LOOPBACK
from tests.fakes.fake_llm import FakeLLM

CALC = ToolSpec(
    "calculator",
    "Evaluate arithmetic.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
)
HELLO = [ChatMessage("system", "Be brief."), ChatMessage("user", "Say hello")]


async def events_of(client: OpenAICompatClient, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("model", "fake-model")
    kwargs.setdefault("messages", HELLO)
    kwargs.setdefault("tools", [])
    return [e async for e in client.stream_chat(**kwargs)]


# -- OpenAI-compatible client --------------------------------------------------------


@pytest.mark.asyncio
async def test_text_stream_is_yielded_in_pieces_and_assembled(fake_llm, llm_client):
    fake_llm.script_text("Hello there, world!", chunks=3, usage=(11, 7))
    events = await events_of(llm_client)

    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == 3 and "".join(deltas) == "Hello there, world!"
    assert [type(e) for e in events[-2:]] == [Usage, ChatResult]
    result = events[-1]
    assert result.text == "Hello there, world!"
    assert result.tool_calls == [] and result.finish_reason == "stop"
    assert result.usage == Usage(prompt_tokens=11, completion_tokens=7)

    body = fake_llm.chat_requests[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "fake-model" and "tools" not in body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"},
    ]


@pytest.mark.asyncio
async def test_default_reply_echoes_with_usage(fake_llm, llm_client):
    result = await collect(llm_client.stream_chat(model="m", messages=HELLO, tools=[]))
    assert result.text == "Echo: Say hello"
    assert result.usage is not None and result.usage.prompt_tokens > 0


@pytest.mark.asyncio
async def test_streamed_calls_one_after_another_reuse_one_connection(fake_llm, llm_client):
    """The answer is read to its end after `[DONE]`, so its connection goes back to the
    pool: three calls in a row ride one TCP connection (a closed, half-read connection
    would cost a handshake per call)."""
    for _ in range(3):
        assert (await collect(llm_client.stream_chat(model="m", messages=HELLO, tools=[]))).text
    ports = [r.client_port for r in fake_llm.requests if r.path.endswith("/chat/completions")]
    assert len(ports) == 3 and len(set(ports)) == 1 and ports[0] > 0


@pytest.mark.asyncio
async def test_tool_calls_are_assembled_from_fragments(fake_llm, llm_client):
    fake_llm.script_tool_calls(
        [("calculator", {"expression": "2 + 2"}), ("current_time", {"timezone": "UTC"})],
        text="Let me check.",
    )
    events = await events_of(llm_client, tools=[CALC])

    ready = [e for e in events if isinstance(e, ToolCallsReady)]
    assert len(ready) == 1
    calls = ready[0].calls
    assert [(c.name, c.arguments) for c in calls] == [
        ("calculator", {"expression": "2 + 2"}),
        ("current_time", {"timezone": "UTC"}),
    ]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    result = events[-1]
    assert result.finish_reason == "tool_calls" and result.text == "Let me check."
    assert result.tool_calls == calls

    offered = fake_llm.chat_requests[-1]["tools"]
    assert offered == [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": CALC.description,
                "parameters": CALC.parameters,
            },
        }
    ]


@pytest.mark.asyncio
async def test_invalid_tool_arguments_are_kept_raw(fake_llm, llm_client):
    fake_llm.script_tool_call("calculator", '{"expression": "1+')
    result = await collect(llm_client.stream_chat(model="m", messages=HELLO, tools=[CALC]))
    assert result.tool_calls[0].arguments == {"_raw": '{"expression": "1+'}


@pytest.mark.asyncio
async def test_tool_round_trip_messages_are_sent_in_openai_shape(fake_llm, llm_client):
    call = ToolCall("call_1", "calculator", {"expression": "6*7"})
    messages = [
        ChatMessage("user", "What is 6*7?"),
        ChatMessage("assistant", "", tool_calls=[call]),
        ChatMessage("tool", "42", tool_call_id="call_1", name="calculator"),
    ]
    await collect(llm_client.stream_chat(model="m", messages=messages, tools=[CALC]))
    sent = fake_llm.chat_requests[-1]["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
            }
        ],
    }
    assert sent[2] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}


@pytest.mark.asyncio
async def test_bad_key_gives_the_providers_message_and_is_not_retryable(fake_llm):
    client = OpenAICompatClient(kind="openai_compatible", api_key="bad-key", base_url=fake_llm.base_url, egress=LOOPBACK)
    with pytest.raises(LLMError) as info:
        await events_of(client)
    assert info.value.status == 401 and not info.value.retryable
    assert info.value.message == "Incorrect API key provided"
    with pytest.raises(LLMError) as info:
        await client.list_models()
    assert info.value.status == 401 and "Incorrect API key provided" in str(info.value)
    await client.aclose()


@pytest.mark.asyncio
async def test_rate_limit_is_retryable_with_retry_after(fake_llm, llm_client):
    fake_llm.script_error(429, "Rate limit reached for requests", retry_after=2)
    with pytest.raises(LLMError) as info:
        await events_of(llm_client)
    err = info.value
    assert err.status == 429 and err.retryable and err.retry_after == 2.0
    assert err.message == "Rate limit reached for requests"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (503, True), (400, False), (404, False)]
)
async def test_status_errors_map_to_retryable_or_not(fake_llm, llm_client, status, retryable):
    fake_llm.script_error(status, f"boom {status}")
    with pytest.raises(LLMError) as info:
        await events_of(llm_client)
    assert info.value.status == status and info.value.retryable is retryable
    assert info.value.message == f"boom {status}"


@pytest.mark.asyncio
async def test_non_json_error_body_is_still_readable(fake_llm, llm_client):
    fake_llm.script_error(502, body="Bad gateway from upstream proxy")
    with pytest.raises(LLMError) as info:
        await events_of(llm_client)
    assert info.value.retryable and "Bad gateway" in info.value.message


@pytest.mark.asyncio
async def test_dropped_connection_mid_stream_is_a_retryable_cut(fake_llm, llm_client):
    fake_llm.script_cut("one two three four five", after_chunks=2)
    seen: list[str] = []
    with pytest.raises(LLMError) as info:
        async for event in llm_client.stream_chat(model="m", messages=HELLO, tools=[]):
            if isinstance(event, TextDelta):
                seen.append(event.text)
    assert seen == ["one", " two"]
    assert info.value.retryable and "cut" in info.value.message


@pytest.mark.asyncio
async def test_stream_ending_without_finish_reason_is_a_retryable_cut(fake_llm, llm_client):
    fake_llm.script_cut("one two three", after_chunks=1, clean=True)
    with pytest.raises(LLMError) as info:
        await events_of(llm_client)
    assert info.value.retryable and "cut" in info.value.message
    # The connection was left usable: the next call on the same client works.
    assert (await collect(llm_client.stream_chat(model="m", messages=HELLO, tools=[]))).text


@pytest.mark.asyncio
async def test_timeout_is_retryable(fake_llm):
    fake_llm.script_text("late", initial_delay=3)
    client = OpenAICompatClient(
        kind="openai_compatible", api_key="k", base_url=fake_llm.base_url, timeout=0.3, egress=LOOPBACK
    )
    with pytest.raises(LLMError) as info:
        await events_of(client)
    assert info.value.retryable and "time" in info.value.message
    await client.aclose()


@pytest.mark.asyncio
async def test_unreachable_server_is_retryable():
    with FakeLLM() as fake:
        url = fake.base_url
    client = OpenAICompatClient(kind="openai_compatible", api_key="k", base_url=url, timeout=2, egress=LOOPBACK)
    with pytest.raises(LLMError) as info:
        await client.list_models()
    assert info.value.retryable and info.value.status is None
    await client.aclose()


@pytest.mark.asyncio
async def test_list_models(fake_llm, llm_client):
    assert await llm_client.list_models() == ["fake-model", "fake-model-large"]
    assert fake_llm.requests[-1].headers["authorization"] == "Bearer test-key"


@pytest.mark.asyncio
async def test_only_the_configured_key_is_accepted():
    with FakeLLM(api_key="right") as fake:
        good = OpenAICompatClient(kind="openai_compatible", api_key="right", base_url=fake.base_url, egress=LOOPBACK)
        wrong = OpenAICompatClient(
            kind="openai_compatible", api_key="wrong", base_url=fake.base_url, egress=LOOPBACK
        )
        assert await good.list_models()
        with pytest.raises(LLMError, match="Incorrect API key provided"):
            await wrong.list_models()
        await good.aclose()
        await wrong.aclose()


def test_parse_arguments():
    assert parse_arguments('{"a": 1}') == {"a": 1}
    assert parse_arguments("") == {}
    assert parse_arguments("[1, 2]") == {"_raw": "[1, 2]"}
    assert parse_arguments("{oops") == {"_raw": "{oops"}


def test_to_openai_messages_keeps_user_text_and_name():
    assert to_openai_messages([ChatMessage("user", "hi", name="ann")]) == [
        {"role": "user", "content": "hi", "name": "ann"}
    ]


# -- the fake itself ------------------------------------------------------------------


def test_fake_stop_is_prompt_even_with_a_slow_reply_in_flight():
    import threading

    import httpx

    fake = FakeLLM()
    base = fake.start()
    fake.script_text("slow", initial_delay=30)

    def call() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                f"{base}/chat/completions",
                headers={"Authorization": "Bearer k"},
                json={"model": "m", "messages": [], "stream": True},
                timeout=10,
            )

    worker = threading.Thread(target=call)
    worker.start()
    while not fake.chat_requests:
        time.sleep(0.01)
    fake.stop()
    worker.join(timeout=10)
    assert not worker.is_alive()  # the open stream was cut, not left to its own time-out


def test_fake_answers_non_streaming_requests_and_assistant_mode_calls_calculator():
    import httpx

    with FakeLLM(behavior="assistant") as fake:
        response = httpx.post(
            f"{fake.base_url}/chat/completions",
            headers={"Authorization": "Bearer k"},
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "What is (2 + 3) * 4?"}],
                "tools": [{"type": "function", "function": {"name": "calculator"}}],
            },
        )
        body = response.json()
        call = body["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "calculator"
        assert json.loads(call["arguments"]) == {"expression": "(2 + 3) * 4"}
        assert body["choices"][0]["finish_reason"] == "tool_calls"


# -- retries ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_rate_limit_then_success_takes_two_attempts(fake_llm, llm_client):
    fake_llm.script_error(429, "slow down", retry_after=0).script_text("finally")
    retries: list[tuple[int, int | None, float]] = []

    async def attempt() -> ChatResult:
        return await collect(llm_client.stream_chat(model="m", messages=HELLO, tools=[]))

    result = await with_retries(
        attempt, on_retry=lambda n, err, delay: retries.append((n, err.status, delay))
    )
    assert result.text == "finally"
    assert retries == [(1, 429, 0.0)]
    assert len(fake_llm.chat_requests) == 2


@pytest.mark.asyncio
async def test_non_retryable_errors_are_raised_at_once(fake_llm):
    client = OpenAICompatClient(kind="openai_compatible", api_key="bad-key", base_url=fake_llm.base_url, egress=LOOPBACK)
    calls = 0

    async def attempt() -> ChatResult:
        nonlocal calls
        calls += 1
        return await collect(client.stream_chat(model="m", messages=HELLO, tools=[]))

    with pytest.raises(LLMError, match="Incorrect API key provided"):
        await with_retries(attempt, attempts=5, base_delay=0.01)
    assert calls == 1 and len(fake_llm.chat_requests) == 1
    await client.aclose()


@pytest.mark.asyncio
async def test_retries_give_up_after_the_last_attempt():
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise LLMError("overloaded", status=503, retryable=True)

    with pytest.raises(LLMError, match="overloaded"):
        await with_retries(attempt, attempts=3, base_delay=0.001, max_delay=0.002)
    assert calls == 3


def test_backoff_grows_with_jitter_and_honours_retry_after():
    for n, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (10, 8.0)]:
        delay = backoff_delay(n, base_delay=0.5, max_delay=8.0)
        assert ceiling / 2 <= delay <= ceiling
    assert backoff_delay(1, base_delay=0.5, max_delay=8.0, retry_after=12) == 12
    assert backoff_delay(1, base_delay=0.5, max_delay=8.0, retry_after=10_000) == 60


def test_retry_after_header_forms():
    assert retry_after_from_headers({"retry-after": "3"}) == 3.0
    assert retry_after_from_headers({"retry-after-ms": "1500"}) == 1.5
    assert retry_after_from_headers({}) is None
    assert retry_after_from_headers({"retry-after": "soon"}) is None
    assert retry_after_from_headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0


# -- factory ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_factory_builds_a_client_for_every_kind():
    assert SUPPORTED_KINDS == ("openai", "deepseek", "anthropic", "ollama", "openai_compatible")
    for kind in ("openai", "deepseek", "ollama"):
        client = make_client(kind=kind, api_key="k", base_url=None)
        assert isinstance(client, OpenAICompatClient)
        assert client.base_url == DEFAULT_BASE_URLS[kind]
        await client.aclose()
    assert isinstance(make_client(kind="anthropic", api_key="k", base_url=None), AnthropicClient)
    custom = make_client(kind="openai_compatible", api_key=None, base_url="http://x/v1")
    assert custom.base_url == "http://x/v1"


def test_factory_refuses_bad_configurations():
    with pytest.raises(LLMError, match="base_url is required"):
        make_client(kind="openai_compatible", api_key="k", base_url=None)
    with pytest.raises(LLMError, match="supported kinds"):
        make_client(kind="gemini", api_key="k", base_url=None)
    with pytest.raises(LLMError, match="API key is required"):
        make_client(kind="anthropic", api_key=None, base_url=None)


# -- Anthropic ----------------------------------------------------------------------------


def test_anthropic_conversion_of_system_tools_and_results():
    call_a = ToolCall("toolu_a", "calculator", {"expression": "1+1"})
    call_b = ToolCall("toolu_b", "current_time", {})
    messages = [
        ChatMessage("system", "Be brief."),
        ChatMessage("system", "Use tools."),
        ChatMessage("user", "Compute and tell the time."),
        ChatMessage("assistant", "Sure.", tool_calls=[call_a, call_b]),
        ChatMessage("tool", "2", tool_call_id="toolu_a"),
        ChatMessage("tool", "2025-01-01T00:00:00+00:00", tool_call_id="toolu_b"),
        ChatMessage("user", "Thanks"),
    ]
    assert to_anthropic_system(messages) == "Be brief.\n\nUse tools."
    assert to_anthropic_messages(messages) == [
        {"role": "user", "content": [{"type": "text", "text": "Compute and tell the time."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Sure."},
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "calculator",
                    "input": {"expression": "1+1"},
                },
                {"type": "tool_use", "id": "toolu_b", "name": "current_time", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "2"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "content": "2025-01-01T00:00:00+00:00",
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    assert to_anthropic_tools([CALC]) == [
        {"name": "calculator", "description": CALC.description, "input_schema": CALC.parameters}
    ]
    assert to_anthropic_system([ChatMessage("user", "hi")]) is None


def _anthropic_status_error(status: int, body: dict, headers: dict | None = None) -> Exception:
    request = httpx2.Request("POST", "https://api.anthropic.com/v1/messages")
    response = httpx2.Response(status, json=body, headers=headers or {}, request=request)
    return anthropic.AsyncAnthropic(api_key="k")._make_status_error(
        "err", body=body, response=response
    )


def test_anthropic_errors_keep_the_providers_message():
    auth = map_anthropic_error(
        _anthropic_status_error(
            401,
            {
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid x-api-key"},
            },
        )
    )
    assert (auth.status, auth.retryable, auth.message) == (401, False, "invalid x-api-key")
    busy = map_anthropic_error(
        _anthropic_status_error(
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            {"retry-after": "4"},
        )
    )
    assert (busy.status, busy.retryable, busy.retry_after) == (529, True, 4.0)


def _sse(events: list[dict]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


ANTHROPIC_TURN = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let "}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "me."}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"expression": '},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '"6*7"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 20},
    },
    {"type": "message_stop"},
]


def _anthropic_with(events: list[dict], seen: list[dict]) -> AnthropicClient:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=_sse(events)
        )

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return AnthropicClient(api_key="k", http_client=http)


@pytest.mark.asyncio
async def test_anthropic_stream_yields_text_tool_calls_and_usage():
    seen: list[dict] = []
    client = _anthropic_with(ANTHROPIC_TURN, seen)
    stream = client.stream_chat(model="claude-test", messages=HELLO, tools=[CALC])
    events = [e async for e in stream]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Let ", "me."]
    result = events[-1]
    assert result.tool_calls == [ToolCall("toolu_1", "calculator", {"expression": "6*7"})]
    assert result.finish_reason == "tool_calls"
    assert result.usage == Usage(prompt_tokens=12, completion_tokens=20)
    assert seen[0]["system"] == "Be brief." and seen[0]["stream"] is True
    assert seen[0]["tools"][0]["input_schema"] == CALC.parameters
    await client.aclose()


@pytest.mark.asyncio
async def test_anthropic_stream_without_message_stop_is_a_cut():
    client = _anthropic_with(ANTHROPIC_TURN[:4], [])
    with pytest.raises(LLMError) as info:
        await collect(client.stream_chat(model="claude-test", messages=HELLO, tools=[]))
    assert info.value.retryable and "cut" in info.value.message
    await client.aclose()


# -- structured output (SPEC §7 output_schema) ------------------------------------------

VERDICT = {"type": "object", "required": ["approved", "category"],
           "properties": {"approved": {"type": "boolean"},
                          "category": {"type": "string", "enum": ["sales", "billing"]}}}


@pytest.mark.asyncio
async def test_openai_asks_for_json_schema_and_the_fake_answers_its_shape(fake_llm, llm_client):
    messages = [ChatMessage("user", "A question about my billing")]
    result = await collect(llm_client.stream_chat(model="m", messages=messages, tools=[],
                                                  output_schema=VERDICT))
    assert json.loads(result.text) == {"approved": True, "category": "billing"}  # the enum the prompt names
    body = fake_llm.chat_requests[-1]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": VERDICT, "strict": False}}
    fake_llm.script_json({"approved": "yes"})  # a wrong answer, as scripted
    result = await collect(llm_client.stream_chat(model="m", messages=messages, tools=[],
                                                  output_schema=VERDICT))
    assert result.text == '{"approved":"yes"}'


@pytest.mark.asyncio
async def test_deepseek_gets_json_object_and_the_schema_as_an_instruction(fake_llm):
    client = OpenAICompatClient(kind="deepseek", api_key="k", base_url=fake_llm.base_url, egress=LOOPBACK)
    await collect(client.stream_chat(model="m", messages=HELLO, tools=[], output_schema=VERDICT))
    body = fake_llm.chat_requests[-1]
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"][0]["role"] == "system" and json.dumps(VERDICT, separators=(",", ":")) in \
        body["messages"][0]["content"]
    await client.aclose()


def _answer_turn(partials: list[str]) -> list[dict]:
    start, *_ = ANTHROPIC_TURN
    return [
        start,
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "toolu_9", "name": "final_answer", "input": {}}},
        *({"type": "content_block_delta", "index": 0,
           "delta": {"type": "input_json_delta", "partial_json": p}} for p in partials),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]


@pytest.mark.asyncio
async def test_anthropic_structured_output_is_a_forced_tool_whose_input_is_the_answer():
    seen: list[dict] = []
    client = _anthropic_with(_answer_turn(['{"approved": ', 'true, "category": "sales"}']), seen)
    events = [e async for e in client.stream_chat(model="c", messages=HELLO, tools=[],
                                                  output_schema=VERDICT)]
    result = events[-1]
    assert json.loads(result.text) == {"approved": True, "category": "sales"}
    assert result.tool_calls == [] and result.finish_reason == "stop"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == result.text
    assert seen[0]["tool_choice"] == {"type": "tool", "name": "final_answer"}
    assert seen[0]["tools"] == [{"name": "final_answer", "description": seen[0]["tools"][0]["description"],
                                 "input_schema": VERDICT}]
    await client.aclose()
    seen.clear()  # with other tools the model may use them first: tool_choice any
    client = _anthropic_with(_answer_turn(['{"value": [1, 2]}']), seen)
    result = await collect(client.stream_chat(model="c", messages=HELLO, tools=[CALC],
                                              output_schema={"type": "array"}))
    assert result.text == "[1,2]" and seen[0]["tool_choice"] == {"type": "any"}
    assert [t["name"] for t in seen[0]["tools"]] == ["calculator", "final_answer"]
    assert seen[0]["tools"][1]["input_schema"]["properties"]["value"] == {"type": "array"}
    await client.aclose()
