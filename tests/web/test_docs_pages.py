"""The docs pages render the document with files shipped in the package: nothing comes from
another host, so they work offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import orchestra.web.apidoc.ui as ui

PAGES = ["/api/v1/docs", "/api/v1/docs/swagger", "/api/v1/docs/redoc"]


@pytest.mark.parametrize("page", PAGES)
async def test_pages_load_only_local_files(client, page):
    response = await client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "http://" not in html and "https://" not in html
    assert "connect-src 'self'" in response.headers["content-security-policy"]
    assert "default-src 'none'" in response.headers["content-security-policy"]
    sources = re.findall(r'(?:src|href|spec-url)="([^"]+)"', html)
    assert sources
    for source in sources:
        assert source.startswith("/api/v1/docs/"), source
        asset = await client.get(source)
        assert asset.status_code == 200, source
        assert len(asset.content) > 100, source


async def test_the_swagger_page_points_at_the_document_without_the_outside_validator(client):
    init = await client.get("/api/v1/docs/assets/swagger-init.js")
    assert init.status_code == 200
    assert '"/api/v1/docs/openapi.json"' in init.text and "validatorUrl: null" in init.text


def test_the_vendored_files_are_pinned_and_licensed():
    assets = Path(ui.__file__).with_name("assets")
    readme = (assets / "README.md").read_text()
    assert f"swagger-ui-dist@{ui.SWAGGER_UI_VERSION}" in readme and f"redoc@{ui.REDOC_VERSION}" in readme
    for name in ("swagger-ui.LICENSE", "redoc.LICENSE", "swagger-ui-bundle.js", "swagger-ui.css",
                 "redoc.standalone.js"):
        assert (assets / name).stat().st_size > 0, name
    # the shipped files are the pinned versions
    assert f'PACKAGE_VERSION:"{ui.SWAGGER_UI_VERSION}"' in (assets / "swagger-ui-bundle.js").read_text()
    assert f'" ReDoc Version: ","{ui.REDOC_VERSION}"' in (assets / "redoc.standalone.js").read_text()
