"""`/api/v1/docs`: the OpenAPI document and two pages that render it (Swagger UI, ReDoc),
both loaded from files shipped in the package, so the pages work without internet.

URLs (as sanic-ext served them before): `/api/v1/docs` and `/api/v1/docs/swagger`
(Swagger UI), `/api/v1/docs/redoc`, `/api/v1/docs/openapi.json`; the UIs' files are
under `/api/v1/docs/assets/`. A Content-Security-Policy keeps every page on this host.
"""

from __future__ import annotations

from pathlib import Path

from sanic import Blueprint, Request
from sanic.response import HTTPResponse, html, raw

from orchestra.errors import NotFoundError
from orchestra.web.apidoc.document import build_document

ASSETS = Path(__file__).with_name("assets")
SWAGGER_UI_VERSION = "5.35.0"
REDOC_VERSION = "2.5.2"
BASE = "/api/v1/docs"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}

SWAGGER_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>orchestra API: Swagger UI</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{BASE}/assets/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="{BASE}/assets/swagger-ui-bundle.js"></script>
<script src="{BASE}/assets/swagger-init.js"></script>
</body></html>
"""

REDOC_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>orchestra API: ReDoc</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body {{ margin: 0; padding: 0; }}</style></head>
<body><redoc spec-url="{BASE}/openapi.json"></redoc>
<script src="{BASE}/assets/redoc.standalone.js"></script>
</body></html>
"""

bp = Blueprint("apidoc", url_prefix=BASE)
ASSET_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


@bp.get("/assets/<asset:str>", name="assets")
async def asset(request: Request, asset: str) -> HTTPResponse:
    """One of the vendored files, by name (no paths); HEAD comes from web/head.py, so it
    answers the same head as GET (Sanic's static handler said Content-Length: 0)."""
    path = ASSETS / asset
    content_type = ASSET_TYPES.get(path.suffix)
    if content_type is None or "/" in asset or not path.is_file():
        raise NotFoundError(f"No documentation asset is named '{asset}'.")
    return raw(path.read_bytes(), content_type=content_type,
               headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"})


def document_of(app) -> bytes:
    """The document as JSON bytes, built once per app (the routes do not change)."""
    body = getattr(app.ctx, "openapi_json", None)
    if body is None:
        import json

        body = json.dumps(build_document(app), ensure_ascii=False).encode()
        app.ctx.openapi_json = body
    return body


@bp.get("/openapi.json")
async def openapi_json(request: Request) -> HTTPResponse:
    return HTTPResponse(document_of(request.app), content_type="application/json")


@bp.get("", strict_slashes=False)
async def swagger_default(request: Request) -> HTTPResponse:
    return html(SWAGGER_PAGE, headers=_PAGE_HEADERS)


@bp.get("/swagger")
async def swagger(request: Request) -> HTTPResponse:
    return html(SWAGGER_PAGE, headers=_PAGE_HEADERS)


@bp.get("/redoc")
async def redoc(request: Request) -> HTTPResponse:
    return html(REDOC_PAGE, headers=_PAGE_HEADERS)
