"""The OpenAPI 3.1 document: valid, complete (every route of the router), and saying what
the routes take and answer: bodies, statuses, errors, parameters, security, links."""

from __future__ import annotations

import re

import pytest
from openapi_spec_validator import validate
from sanic import Sanic

from orchestra.engine.llm.factory import SUPPORTED_KINDS
from orchestra.engine.store.events import KINDS
from orchestra.services.roles import ROLE_NAMES
from orchestra.web.apidoc.document import UndocumentedRoute, api_routes, build_document
from orchestra.web.apidoc.events import EVENT_FIELDS
from orchestra.web.app import create_app

DOC = "/api/v1/docs/openapi.json"
METHODS = {"get", "put", "post", "delete", "patch"}


@pytest.fixture
async def doc(client) -> dict:
    response = await client.get(DOC)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def resolve(doc: dict, schema: dict) -> dict:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return doc["components"]["schemas"][name]
    return schema


def body_schema(doc: dict, path: str, method: str) -> dict:
    operation = doc["paths"][path][method]
    request_body = operation["requestBody"]
    assert request_body.get("required") is True
    return resolve(doc, request_body["content"]["application/json"]["schema"])


@pytest.mark.parametrize(
    "path,method,fields",
    [
        ("/api/v1/auth/register", "post", {"user_name", "password"}),
        ("/api/v1/auth/login", "post", {"user_name", "password"}),
        ("/api/v1/auth/refresh", "post", {"refresh_token"}),
        ("/api/v1/auth/authority", "put", {"user_id", "new_authority"}),
    ],
)
async def test_auth_routes_document_their_request_bodies(doc, path, method, fields):
    schema = body_schema(doc, path, method)
    assert schema["type"] == "object"
    assert set(schema["properties"]) == fields  # nothing internal (model_config) leaks in
    assert set(schema["required"]) == fields
    for name in fields:
        prop = schema["properties"][name]
        assert prop["type"] == "string" or "enum" in prop


async def test_new_authority_lists_the_roles(doc):
    schema = body_schema(doc, "/api/v1/auth/authority", "put")
    assert set(schema["properties"]["new_authority"]["enum"]) == {
        "SUPER_ADMINISTRATOR", "ADMINISTRATOR", "USER"
    }


async def test_every_auth_route_is_listed_with_security_where_protected(doc):
    paths = doc["paths"]
    listed = {(p, m) for p, ops in paths.items() if p.startswith("/api/v1/auth") for m in ops}
    assert listed >= {
        ("/api/v1/auth/register", "post"), ("/api/v1/auth/login", "post"),
        ("/api/v1/auth/refresh", "post"), ("/api/v1/auth/authority", "put"),
        ("/api/v1/auth/list", "get"), ("/api/v1/auth/{user_id}", "delete"),
    }
    for path, method in [("/api/v1/auth/authority", "put"), ("/api/v1/auth/list", "get"),
                         ("/api/v1/auth/{user_id}", "delete")]:
        assert paths[path][method]["security"] == [{"bearer": []}]
    for path in ("/api/v1/auth/register", "/api/v1/auth/login", "/api/v1/auth/refresh"):
        assert not paths[path]["post"].get("security")
    params = paths["/api/v1/auth/{user_id}"]["delete"]["parameters"]
    assert {"name": "user_id", "in": "path"}.items() <= params[0].items()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def operations(doc: dict):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def schema(doc: dict, name: str) -> dict:
    return doc["components"]["schemas"][name]


async def test_the_document_is_valid_openapi_3_1(doc):
    assert doc["openapi"] == "3.1.0"
    validate(doc)  # openapi-spec-validator: raises on any error


async def test_every_route_of_the_router_is_documented(client, doc):
    routes = {(path, method) for path, method, _, _ in api_routes(client.app)}
    documented = {(path, method) for path, method, _ in operations(doc)}
    assert routes == documented
    assert len(routes) >= 40


def test_a_route_without_description_fails_the_build(settings):
    app = create_app(settings)

    @app.get("/api/v1/undocumented")
    async def undocumented(request):  # pragma: no cover - never called
        return None

    app.router.finalize()
    with pytest.raises(UndocumentedRoute, match="GET /api/v1/undocumented"):
        build_document(app)
    Sanic._app_registry.pop(app.name, None)


async def test_no_pydantic_internals_leak_and_bodies_say_what_is_required(doc):
    for name, component in doc["components"]["schemas"].items():
        assert not {"model_config", "accepts_nul"} & set(component.get("properties", {})), name
    assert set(body_schema(doc, "/api/v1/provider", "post")["required"]) == {"name", "provider", "model_id"}
    assert set(body_schema(doc, "/api/v1/agent/worker", "post")["required"]) == {"name", "provider_id"}
    assert set(body_schema(doc, "/api/v1/workflow/run", "post")["required"]) == {"template_id"}
    assert set(body_schema(doc, "/api/v1/workflow/reply/{trace_id}", "post")["required"]) == {"content"}


async def test_enums_and_length_rules(doc):
    provider = body_schema(doc, "/api/v1/provider", "post")["properties"]
    assert provider["provider"]["enum"] == list(SUPPORTED_KINDS)
    name = re.compile(provider["name"]["pattern"])  # 1..128 characters once stripped
    assert name.search("n" * 128) and name.search("  a b\t") and name.search(" " + "n" * 128 + " ")
    assert not name.search("n" * 129) and not name.search("   ") and not name.search("a\x01b")
    authority = body_schema(doc, "/api/v1/auth/authority", "put")["properties"]
    assert set(authority["new_authority"]["enum"]) == set(ROLE_NAMES)
    password = body_schema(doc, "/api/v1/auth/register", "post")["properties"]["password"]
    assert (password["minLength"], password["maxLength"]) == (8, 256)
    worker = body_schema(doc, "/api/v1/agent/worker", "post")["properties"]
    builtin, mcp_tool = worker["tools"]["items"]["anyOf"]  # a built-in, or <server>.<tool> (SPEC §9)
    assert set(builtin["enum"]) >= {"calculator", "current_time", "read_upload", "ask_user"}
    assert re.search(mcp_tool["pattern"], "time.get_current_time")
    assert not re.search(mcp_tool["pattern"], "calculator") and not re.search(mcp_tool["pattern"], ".x")
    template = body_schema(doc, "/api/v1/workflow/template", "post")["properties"]
    assert (template["steps"]["minItems"], template["steps"]["maxItems"]) == (1, 50)


async def test_template_steps_are_the_step_union(doc):
    steps = body_schema(doc, "/api/v1/workflow/template", "post")["properties"]["steps"]
    step = schema(doc, steps["items"]["$ref"].rsplit("/", 1)[-1])
    assert set(step["properties"]) == {  # SPEC §4, §7's step policies, §8's containers
        "id", "agent", "prompt", "depends_on",
        "when", "output_schema", "timeout_seconds", "retry", "on_error", "on_tool_error", "tools", "default",
        "foreach", "steps", "output", "loop", "http", "workflow",  # §14's calls
        "code",  # §17
    }
    assert step["properties"]["timeout_seconds"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 86400}
    assert step["properties"]["on_error"]["enum"] == ["fail", "continue"]
    assert set(step["required"]) == {"id"}  # agent and prompt: not for a loop or a foreach with steps
    foreach = schema(doc, step["properties"]["foreach"]["anyOf"][0]["$ref"].rsplit("/", 1)[-1])
    assert foreach["properties"]["max_concurrency"] == {
        "type": "integer", "minimum": 1, "maximum": 64, "default": 4, "description": "Items at once."}
    assert set(foreach["required"]) == {"items"}
    loop = schema(doc, step["properties"]["loop"]["anyOf"][0]["$ref"].rsplit("/", 1)[-1])
    assert set(loop["required"]) == {"steps", "until", "max_iterations"}
    assert loop["properties"]["max_iterations"]["maximum"] == 100
    assert loop["properties"]["steps"]["items"]["$ref"] == steps["items"]["$ref"]  # the same Step, nested
    agents = [schema(doc, s["$ref"].rsplit("/", 1)[-1]) for s in step["properties"]["agent"]["anyOf"]
              if "$ref" in s]
    assert [set(a["required"]) for a in agents] == [{"worker"}, {"node"}, {"human"}]
    assert all(a["additionalProperties"] is False for a in agents)
    assert agents[1]["properties"]["node"]["enum"] == ["planner", "reviewer", "summarizer"]
    assert agents[2]["properties"]["human"]["const"] is True


async def test_success_statuses_and_media_types(doc):
    ops = {(p, m): op for p, m, op in operations(doc)}
    created = {("/api/v1/auth/register", "post"), ("/api/v1/provider", "post"),
               ("/api/v1/agent/worker", "post"), ("/api/v1/resource/skill", "post"),
               ("/api/v1/workflow/template", "post"), ("/api/v1/adapter/client/upload", "post"),
               ("/api/v1/resource/mcp", "post"), ("/api/v1/auth/key", "post"),
               ("/api/v1/workflow/hook", "post"), ("/api/v1/workflow/schedule", "post"),
               ("/api/v1/workflow/subscription", "post"), ("/api/v1/resource/secret", "post"),
               ("/api/v1/workflow/template/{template_id}/versions/{number}/restore", "post"),
               ("/api/v1/workspace", "post"), ("/api/v1/workspace/{workspace_id}/member", "post")}
    for key, op in ops.items():
        success = [s for s in op["responses"] if s.startswith("2")]
        started = {("/api/v1/workflow/run", "post"), ("/api/v1/workflow/run/{trace_id}/retry", "post"),
                   ("/api/v1/workflow/run/{trace_id}/fork", "post"),
                   ("/api/v1/hooks/{hook_id}", "post")}
        expected = "201" if key in created else "202" if key in started else "200"
        assert success[0] == expected, key
        assert "default" not in op["responses"], key
    sse = ops[("/api/v1/workflow/sse/{trace_id}", "get")]
    assert list(sse["responses"]["200"]["content"]) == ["text/event-stream"]
    assert "204" in sse["responses"]
    download = ops[("/api/v1/adapter/client/upload/{file_id}", "get")]
    assert list(download["responses"]["200"]["content"]) == ["*/*"]
    upload = ops[("/api/v1/adapter/client/upload", "post")]
    assert list(upload["requestBody"]["content"]) == ["multipart/form-data"]
    for key, op in ops.items():
        if key not in {("/api/v1/workflow/sse/{trace_id}", "get"), ("/api/v1/adapter/client/upload/{file_id}", "get")}:
            success = next(s for s in op["responses"] if s.startswith("2"))
            assert list(op["responses"][success]["content"]) == ["application/json"], key


async def test_errors_are_documented_with_the_shared_error_schema(doc):
    error = schema(doc, "Error")
    assert set(error["required"]) == {"message", "error"} and "detail" in error["properties"]
    for path, method, op in operations(doc):
        errors = {int(s): r for s, r in op["responses"].items() if s[0] in "45"}
        for response in errors.values():
            assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
        assert {431, 503} <= set(errors), (path, method)
        if op["security"]:
            assert 401 in errors, (path, method)
        if "{" in path:
            assert 404 in errors, (path, method)
        if "application/json" in op.get("requestBody", {}).get("content", {}):
            assert {400, 413, 422} <= set(errors), (path, method)
    ops = {(p, m): op for p, m, op in operations(doc)}
    register = ops[("/api/v1/auth/register", "post")]["responses"]
    assert {"409", "429"} <= set(register)
    assert register["429"]["headers"]["Retry-After"]["required"] is True
    assert "403" in ops[("/api/v1/provider", "post")]["responses"]  # ADMINISTRATOR and above
    assert "403" not in ops[("/api/v1/provider", "get")]["responses"]
    # a provider that cannot be reached or refuses is 200 ok: false (SPEC §3), not 502
    assert "502" not in ops[("/api/v1/provider/{provider_id}/check", "post")]["responses"]


async def test_parameters_and_security(doc):
    ops = {(p, m): op for p, m, op in operations(doc)}
    names = lambda op: {(p["name"], p["in"]) for p in op.get("parameters", [])}  # noqa: E731
    assert {("limit", "query"), ("all", "query")} <= names(ops[("/api/v1/workflow/run", "get")])
    assert ("after", "query") in names(ops[("/api/v1/workflow/run/{trace_id}/events", "get")])
    sse = ops[("/api/v1/workflow/sse/{trace_id}", "get")]
    assert {("trace_id", "path"), ("Last-Event-ID", "header"), ("last_event_id", "query")} <= names(sse)
    assert sse["security"] == [{"bearer": []}, {"access_token": []}]
    schemes = doc["components"]["securitySchemes"]
    assert schemes["access_token"] == {**schemes["access_token"], "type": "apiKey", "in": "query"}
    assert ops[("/api/v1/provider", "get")]["security"] == [{"bearer": []}]
    assert ops[("/api/v1/auth/login", "post")]["security"] == []


async def test_the_stream_describes_every_event_kind(doc):
    assert set(EVENT_FIELDS) == set(KINDS)  # the engine's kinds, no more, no fewer
    description = doc["paths"]["/api/v1/workflow/sse/{trace_id}"]["get"]["description"]
    for kind in KINDS:
        assert f"| `{kind}` |" in description, kind
    assert "`run_resumed`" in description


async def test_links_lead_from_resources_to_what_uses_them(doc):
    ids = {op["operationId"] for _, _, op in operations(doc)}
    links = {}
    for _, _, op in operations(doc):
        for response in op["responses"].values():
            for link in response.get("links", {}).values():
                assert link["operationId"] in ids
                links[(op["operationId"], link["operationId"])] = link
    assert {
        ("workflow.create_template", "workflow.start_run"),
        ("workflow.start_run", "workflow.stream"),
        ("workflow.start_run", "workflow.reply"),
        ("workflow.start_run", "workflow.cancel_run"),
        ("provider.create", "agent.create_worker"),
        ("adapter.upload", "adapter.download"),
        ("adapter.upload", "workflow.start_run"),
        ("agent.create_worker", "workflow.create_template"),
    } <= set(links)
    run = links[("workflow.create_template", "workflow.start_run")]
    assert run["requestBody"]["template_id"] == "$response.body#/template_id"
