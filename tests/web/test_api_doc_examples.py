"""Every example request body in docs/api.md matches the OpenAPI document's request schema
of its route, so the prose and the machine-readable contract cannot drift apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
REQUEST_LINE = re.compile(r"^(GET|POST|PUT|DELETE) (/api/v1/\S+)\s*$")


def doc_examples() -> list[tuple[str, str, object]]:
    """(method, path, body) of each example request with a JSON body in docs/api.md."""
    found = []
    for block in FENCE.findall(API_MD.read_text()):
        block = block.replace("\\\n", " ")
        for command in re.findall(r"curl [^\n]*", block):
            body = re.search(r"-d '([^']*)'", command)
            url = re.search(r"https?://[^/\s]+(/api/v1/[^\s'\"]*)", command)
            if body and url:
                method = re.search(r"-X (\w+)", command)
                found.append((method.group(1) if method else "POST", url.group(1), json.loads(body.group(1))))
        lines = block.splitlines()
        for index, line in enumerate(lines):
            request = REQUEST_LINE.match(line)
            if not request:
                continue
            body_lines = []
            for following in lines[index + 1:]:
                if following.startswith("→") or REQUEST_LINE.match(following):
                    break
                body_lines.append(following)
            text = "\n".join(body_lines).strip()
            if text:
                found.append((request.group(1), request.group(2), json.loads(text)))
    return found


def operation_path(doc: dict, path: str) -> str:
    """The document's path template that `path` (with example ids) belongs to."""
    candidates = [
        template for template in doc["paths"]
        if re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", template), path)
    ]
    assert candidates, f"docs/api.md names {path}, which the document does not have"
    return min(candidates, key=lambda t: t.count("{"))  # /auth/list before /auth/{user_id}


@pytest.fixture
def settings_overrides() -> dict:
    """The docs' stdio example runs mcp-server-time: a server that allows it documents it."""
    return {"mcp_stdio_commands": "mcp-server-time"}


@pytest.fixture
async def doc(client) -> dict:
    return (await client.get("/api/v1/docs/openapi.json")).json()


def test_docs_api_md_has_examples_for_the_main_routes():
    routes = {(m, p) for m, p, _ in doc_examples()}
    assert len(routes) >= 10, routes
    assert ("POST", "/api/v1/workflow/template") in routes
    assert ("POST", "/api/v1/provider") in routes


async def test_every_example_body_matches_its_request_schema(doc):
    for method, path, body in doc_examples():
        template = operation_path(doc, path)
        operation = doc["paths"][template][method.lower()]
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        validator = jsonschema.Draft202012Validator({**schema, "components": doc["components"]})
        problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]
        assert not problems, f"{method} {path} example in docs/api.md: {problems}"


async def test_a_wrong_example_would_be_caught(doc):
    """The check itself can fail: a provider kind the API does not know is refused."""
    schema = doc["paths"]["/api/v1/provider"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator({**schema, "components": doc["components"]})
    assert not validator.is_valid({"name": "g", "provider": "gemini", "model_id": "gemini-pro"})
