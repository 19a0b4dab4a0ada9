"""The OpenAPI document says which scope an API key needs on each protected route
(`x-api-key-scope`; null: keys are refused), as `@protected(scope=…)` enforces it."""


async def test_the_api_document_names_each_routes_key_scope(client):
    paths = (await client.get("/api/v1/docs/openapi.json")).json()["paths"]
    assert paths["/api/v1/workflow/run"]["post"]["x-api-key-scope"] == "run:start"
    assert paths["/api/v1/workflow/sse/{trace_id}"]["get"]["x-api-key-scope"] == "run:read"
    assert paths["/api/v1/workflow/template/{template_id}"]["put"]["x-api-key-scope"] == "template:write"
    assert paths["/api/v1/auth/key"]["post"]["x-api-key-scope"] is None
    assert paths["/api/v1/auth/list"]["get"]["x-api-key-scope"] is None
    assert paths["/api/v1/provider"]["get"]["x-api-key-scope"] is None
    assert "x-api-key-scope" not in paths["/api/v1/hooks/{hook_id}"]["post"]  # public: no credential
