"""HEAD and OPTIONS answered on every route (orchestra.web.head), and a CORS preflight."""

from __future__ import annotations

import pytest


def allow(response) -> set[str]:
    return {m.strip() for m in response.headers["allow"].split(",")}


@pytest.mark.parametrize(
    "path,methods",
    [
        ("/api/v1/auth/register", {"POST", "OPTIONS"}),
        ("/api/v1/auth/list", {"GET", "HEAD", "OPTIONS"}),
        ("/api/v1/auth/0b5e7a3c-2d1f-4c8e-9a6b-7f3e1d2c4b5a", {"DELETE", "OPTIONS"}),
        ("/api/v1/workflow/template", {"GET", "HEAD", "POST", "OPTIONS"}),
    ],
)
async def test_options_answers_204_with_the_paths_methods(client, path, methods):
    response = await client.options(path)
    assert response.status_code == 204, response.text
    assert response.content == b""
    assert allow(response) == methods


async def test_head_answers_as_get_does_without_a_body(client, users):
    user = await users.make("someone")
    get = await client.get("/api/v1/workflow/template", headers=user["headers"])
    head = await client.head("/api/v1/workflow/template", headers=user["headers"])
    assert (get.status_code, head.status_code) == (200, 200)
    assert head.content == b"" and get.json()
    assert head.headers["content-type"] == get.headers["content-type"]
    assert (await client.head("/api/v1/workflow/template")).status_code == 401


class TestCorsPreflight:
    @pytest.fixture
    def settings_overrides(self):
        return {"cors_origins": "https://front.example"}

    async def test_a_preflight_from_an_allowed_origin_is_answered(self, client):
        response = await client.options(
            "/api/v1/auth/login",
            headers={"Origin": "https://front.example", "Access-Control-Request-Method": "POST"},
        )
        assert response.status_code == 204
        assert response.headers["access-control-allow-origin"] == "https://front.example"
        assert "POST" in response.headers["access-control-allow-methods"]

    async def test_another_origin_gets_no_cors_headers(self, client):
        response = await client.options(
            "/api/v1/auth/login",
            headers={"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"},
        )
        assert response.status_code == 204
        assert "access-control-allow-origin" not in response.headers
