"""The web console: static files from `orchestra/web/console/`, served at `/` and `/console/`.

Only files shipped in the package are served (no directory listing, no path outside the
folder), each with a strict Content-Security-Policy: scripts, styles and requests go to
this origin only, no inline script, no frames. The console is a client of the public API
like any other; this blueprint knows nothing about users or runs.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from sanic import Blueprint, Request
from sanic.response import HTTPResponse, raw
from sanic_ext import openapi

from orchestra.errors import NotFoundError

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidate (ETag): an upgraded package shows at once
}
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
}

bp = Blueprint("console")


@lru_cache(maxsize=128)
def _load(relative: str) -> tuple[bytes, str, str]:
    """(bytes, content type, ETag) of one console file; NotFoundError outside the folder."""
    path = (CONSOLE_DIR / relative).resolve()
    if not path.is_relative_to(CONSOLE_DIR) or not path.is_file() or path.suffix not in CONTENT_TYPES:
        raise NotFoundError(f"Nothing is at /console/{relative}.")
    body = path.read_bytes()
    return body, CONTENT_TYPES[path.suffix], '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def _serve(request: Request, relative: str) -> HTTPResponse:
    body, content_type, etag = _load(relative)
    headers = {**SECURITY_HEADERS, "ETag": etag}
    if request.headers.get("if-none-match") == etag:
        return raw(b"", status=304, headers=headers)
    # On HEAD, Sanic drops the body itself and keeps its Content-Length, as RFC 9110 asks.
    return raw(body, content_type=content_type, headers=headers)


@bp.route("/", methods=["GET", "HEAD"])
@openapi.exclude()  # static files: not part of the API document
async def index(request: Request) -> HTTPResponse:
    """The console's single page; its own router reads the URL fragment (`#/runs/…`)."""
    return _serve(request, "index.html")


@bp.route("/console/<relative:path>", methods=["GET", "HEAD"])
@openapi.exclude()
async def asset(request: Request, relative: str) -> HTTPResponse:
    """A script, style sheet, image or licence of the console."""
    return _serve(request, relative)
