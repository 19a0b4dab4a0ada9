"""The fake model's `fake:` directives, over real HTTP (issue 29, item 7): a prompt picks
the structured fields, the tool and its arguments, and how many times it fails."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from orchestra.testing.fake_llm import FakeLLM

SCHEMA = {"type": "object", "required": ["category", "urgency", "urgent"], "properties": {
    "category": {"type": "string", "enum": ["technical", "billing"]},
    "urgency": {"type": "integer", "minimum": 1, "maximum": 5},
    "urgent": {"type": "boolean"}, "notes": {"type": "string"}}}
TIME_TOOL = {"type": "function", "function": {"name": "time__get_current_time_0a1b2c", "parameters": {
    "type": "object", "required": ["timezone"], "properties": {"timezone": {"type": "string"}}}}}


def _ask(fake: FakeLLM, prompt: str, **extra) -> httpx.Response:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": prompt}], **extra}
    return httpx.post(f"{fake.base_url}/chat/completions", json=body,
                      headers={"Authorization": "Bearer any"}, timeout=10)


def _structured(fake: FakeLLM, prompt: str) -> dict:
    answer = _ask(fake, prompt, response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    assert answer.status_code == 200, answer.text
    return json.loads(answer.json()["choices"][0]["message"]["content"])


@pytest.mark.parametrize("behavior", ["echo", "assistant"])
def test_fields_take_the_values_a_prompt_names(behavior):
    with FakeLLM(behavior=behavior) as fake:
        assert _structured(fake, "Classify: it broke") == {"category": "technical", "urgency": 1, "urgent": True}
        chosen = _structured(fake, 'Classify fake:category=billing fake:urgency=4 fake:urgent=false '
                                   'fake:notes="two words"')
        assert chosen == {"category": "billing", "urgency": 4, "urgent": False, "notes": "two words"}


def test_a_tool_is_called_with_the_arguments_a_prompt_gives():
    with FakeLLM(behavior="assistant") as fake:
        prompt = 'What time is it? fake:tool=time.get_current_time fake:args={"timezone": "Europe/Paris"}'
        answer = _ask(fake, prompt, tools=[TIME_TOOL]).json()
        (call,) = answer["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "time__get_current_time_0a1b2c"
        assert json.loads(call["function"]["arguments"]) == {"timezone": "Europe/Paris"}


def test_failures_are_counted_per_distinct_prompt():
    with FakeLLM() as fake:
        statuses = [_ask(fake, "Draft it fake:fail=2").status_code for _ in range(3)]
        assert statuses == [400, 400, 200]
        assert _ask(fake, "Another prompt fake:fail=1 fake:fail_status=503").status_code == 503
        assert _ask(fake, "Another prompt fake:fail=1 fake:fail_status=503").status_code == 200
        assert _ask(fake, "Draft it fake:fail=2").status_code == 200  # that prompt's failures ran out


def test_help_documents_every_directive_with_an_example():
    shown = subprocess.run([sys.executable, "-m", "orchestra.testing.fake_llm", "--help"],
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    for example in ("fake:category=billing", "fake:tool=", 'fake:args={"timezone": "Europe/Paris"}',
                    "fake:fail=2", "fake:fail_status=", "fake:value=", "fake:text="):
        assert example in shown.stdout, example


def test_a_request_cut_before_its_body_is_no_chat_request():
    """A client killed between its request head and its body (a server process under
    kill -9) asked the model nothing: it is recorded, but not among the chat requests that
    tests count prompts in."""
    with FakeLLM() as fake:
        port = int(fake.base_url.rsplit(":", 1)[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n"
                         b"Authorization: Bearer k\r\n\r\n")
        _ask(fake, "a whole one")
        deadline = time.monotonic() + 5
        while len(fake.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(fake.requests) == 2
        assert [body["messages"][-1]["content"] for body in fake.chat_requests] == ["a whole one"]
