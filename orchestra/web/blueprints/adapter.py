"""`/api/v1/adapter/client/upload`: streamed multipart uploads, list, download, delete.

The upload route is a Sanic streaming route: Sanic lifts its REQUEST_MAX_SIZE (the
1 MiB JSON limit) for stream handlers, so the uploads service enforces its own limits
while it parses the body chunk by chunk.
"""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import AsyncIterator
from urllib.parse import quote

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.errors import PayloadTooLargeError
from orchestra.services import uploads as upload_service
from orchestra.services.roles import Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.auth import protected
from orchestra.web.paging import PAGE_ERRORS, page_args, page_body, page_params
from orchestra.web.responses import SUCCESS

bp = Blueprint("adapter", url_prefix="/adapter")

PATH = "/client/upload"


class _Counter:
    """The request body as chunks, counting the bytes read."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.received = 0
        self.ended = False  # the whole body was read (a quota refusal comes after that)

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.request.stream.read()
            if chunk is None:
                self.ended = True
                return
            self.received += len(chunk)
            yield chunk


@bp.post(PATH, stream=True)
@documented(
    "Upload one or more files (multipart/form-data, parts named 'file')",
    request_content={
        "multipart/form-data": {
            "schema": out.UploadForm,
            "encoding": {"file": {"contentType": "application/octet-stream"}},
        }
    },
    response=out.Uploaded, status=201,
    errors={
        400: "BadRequestError: not multipart/form-data, or a malformed body.",
        413: "PayloadTooLargeError: a file over the limit, too many files, too big a body, or "
             "the files would take your stored uploads past the per-user quota.",
        422: "ValidationError: no part named file with a file name.",
    },
    links={
        "Download": Link("adapter.download", {"file_id": "$response.body#/files/0/file_id"}),
        "Delete": Link("adapter.delete_file", {"file_id": "$response.body#/files/0/file_id"}),
        "AttachToRun": Link(
            "workflow.start_run",
            request_body={"template_id": "", "files": ["$response.body#/files/0/file_id"]},
            description="Attach the file to a run; template_id names a template you may read.",
        ),
    },
)
@protected(Role.USER)
async def upload(request: Request):
    core = request.app.ctx.core
    cap = upload_service.body_limit(core.settings.upload_max_bytes)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise PayloadTooLargeError(f"An upload request may carry at most {cap} bytes.")
    body = _Counter(request)
    try:
        files = await upload_service.receive(
            core,
            owner_id=request.ctx.principal.user_id,
            content_type=request.headers.get("content-type"),
            chunks=body.chunks(),
        )
    except PayloadTooLargeError:
        if not body.ended:
            await _drain(request, budget=cap - body.received)
        raise
    return json(
        {"message": SUCCESS, "files": [_public(upload_service.describe(f)) for f in files]},
        status=201,
    )


@bp.get(PATH)
@documented(
    "List your files, oldest first (paged)", response=out.FileList,
    errors={422: PAGE_ERRORS}, params=page_params("files"),
)
@protected(Role.USER)
async def list_files(request: Request):
    limit, cursor = page_args(request)
    page = await upload_service.list_uploads(
        request.app.ctx.core, owner_id=request.ctx.principal.user_id, limit=limit, cursor=cursor
    )
    return json(page_body("files", [upload_service.describe(f) for f in page.rows], page))


@bp.get(f"{PATH}/<file_id:str>")
@documented(
    "Download one of your files (the exact bytes, as an attachment)",
    response_content={"*/*": {"schema": {"type": "string", "format": "binary"}}},
)
@protected(Role.USER)
async def download(request: Request, file_id: str):
    record, handle = await upload_service.open_upload(
        request.app.ctx.core, owner_id=request.ctx.principal.user_id, file_id=file_id
    )
    try:
        response = await request.respond(
            status=200,
            content_type=record.content_type,
            headers={
                "Content-Length": str(record.size),
                "Content-Disposition": content_disposition(record.filename),
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "private, no-cache",
            },
        )
        while chunk := await asyncio.to_thread(handle.read, upload_service.READ_CHUNK):
            await response.send(chunk)
        await response.eof()
    finally:
        handle.close()


@bp.delete(f"{PATH}/<file_id:str>")
@documented("Delete one of your files", response=out.Done)
@protected(Role.USER)
async def delete_file(request: Request, file_id: str):
    await upload_service.delete_upload(
        request.app.ctx.core, owner_id=request.ctx.principal.user_id, file_id=file_id
    )
    return json({"message": SUCCESS})


def content_disposition(filename: str) -> str:
    """`attachment` with an ASCII fallback name and the exact name as RFC 6266 `filename*`."""
    ascii_name = unicodedata.normalize("NFKD", filename).encode("ascii", "ignore").decode()
    ascii_name = "".join(ch if 0x20 <= ord(ch) < 0x7F and ch not in '"\\;' else "_" for ch in ascii_name)
    ascii_name = ascii_name.strip() or "download"
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}"


def _public(description: dict) -> dict:
    """The upload answer names exactly SPEC's five fields."""
    return {k: description[k] for k in ("file_id", "filename", "size", "content_type", "sha256")}


async def _drain(request: Request, *, budget: int) -> None:
    """Read and drop what is left of a refused body (up to `budget` bytes), so the client
    gets its 413 answer instead of a reset connection while it is still sending."""
    stream = request.stream
    while stream is not None and budget > 0:
        chunk = await stream.read()
        if chunk is None:
            return
        budget -= len(chunk)
