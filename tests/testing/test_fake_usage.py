"""The fake model's usage rules (SPEC §12): cached tokens, max_tokens, and a
tokens-per-minute limit answered 429 with Retry-After, over real HTTP."""

from __future__ import annotations

import httpx

from orchestra.egress import EgressPolicy
from orchestra.engine.llm import ChatMessage, LLMError, collect, make_client
from orchestra.testing.fake_llm import FakeLLM

LOOPBACK = EgressPolicy.parse("127.0.0.1/32")


def _client(url: str):
    return make_client(kind="openai_compatible", api_key="k", base_url=url, egress=LOOPBACK)


def _post(url: str, prompt: str, **extra) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", headers={"Authorization": "Bearer k"}, json={
        "model": "fake-model", "messages": [{"role": "user", "content": prompt}], **extra})


def test_cached_tokens_are_reported_within_the_prompt():
    with FakeLLM() as fake:
        usage = _post(fake.base_url, "one two three four fake:cached=3").json()["usage"]
        assert usage["prompt_tokens"] == 5
        assert usage["prompt_tokens_details"] == {"cached_tokens": 3}
        usage = _post(fake.base_url, "a b fake:cached=99").json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 3}  # never above the prompt


async def test_the_client_reads_cached_tokens_and_max_tokens_caps_the_answer():
    with FakeLLM() as fake:
        fake.script_text("one two three four five six", usage=None)
        client = _client(fake.base_url)
        try:
            result = await collect(client.stream_chat(
                model="fake-model", messages=[ChatMessage("user", "hello there fake:cached=1")],
                tools=[], max_tokens=2))
        finally:
            await client.aclose()
        assert result.text == "one two" and result.finish_reason == "length"
        assert result.usage.completion_tokens == 2 and result.usage.cached_tokens == 1
        assert fake.chat_requests[-1]["max_tokens"] == 2


def test_over_tokens_per_minute_is_429_with_retry_after():
    with FakeLLM(tokens_per_minute=16) as fake:
        first = _post(fake.base_url, "one two three four five six")  # 6 + the echo's 7
        assert first.status_code == 200
        refused = _post(fake.base_url, "one two three four five")
        assert refused.status_code == 429
        assert float(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert fake.meter.refused == 1
        assert _post(fake.base_url, "one").status_code == 200  # what fits passes


async def test_a_429_reaches_the_client_with_its_retry_after():
    with FakeLLM(tokens_per_minute=3) as fake:
        client = _client(fake.base_url)
        try:
            try:
                await collect(client.stream_chat(model="fake-model", tools=[], messages=[
                    ChatMessage("user", "far too many words for this limit")]))
            except LLMError as err:
                assert err.status == 429 and err.retryable and err.retry_after >= 1
            else:
                raise AssertionError("a 429 was expected")
        finally:
            await client.aclose()
