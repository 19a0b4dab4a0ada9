"""The OpenAPI document lists every auth route with its request body schema."""

from __future__ import annotations

import pytest

DOC = "/api/v1/docs/openapi.json"


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
