"""Uploaded files: streamed to `uploads/<user_id>/<file_id>`, listed, read and removed.

The multipart body is parsed incrementally (python-multipart's push parser) while it
arrives, so no file is ever held in memory whole: each part goes to a private temp
file in the owner's folder, its sha256 computed on the way, and is renamed into place
only when the whole request has arrived and every file is within the limit. Any
failure (too large, malformed, client gone) removes every temp file; no row is
written. The client's file name is metadata only, never part of a path.

A temp file (`uploads/<uid>/.<file_id>.part`) is held under an exclusive `flock` from
its creation until it is renamed into place or removed. A process killed mid-upload
(`kill -9`, power loss) cannot clean up, but its lock dies with it: at start the server
sweeps every `.part` file no live process holds, and every per-user folder left empty
(`sweep_stray_files`). A live upload of another worker sharing the folder is never touched.

The request holds no store connection while the body streams in (`@protected` hands it
back after reading the caller); the store is read once before, for the owner's usage,
and used once after, to record the finished files.

Per-user quota (`ORCHESTRA_UPLOAD_QUOTA_BYTES`): a request whose files would take the
owner's stored uploads past it is refused whole (413). The body is cut off as soon as
it passes what was left when it began; the final word is taken when the files are
recorded, under a lock on the owner's row (PostgreSQL, every process) or SQLite's write
lock, so concurrent uploads of one user cannot pass the quota together.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import re
import unicodedata
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from peewee import fn
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from orchestra.db.database import release_connection
from orchestra.db.models import Upload, User, iso, new_id, storable
from orchestra.errors import BadRequestError, NotFoundError, PayloadTooLargeError, ValidationError
from orchestra.services import audit
from orchestra.services.paging import DEFAULT_LIMIT, Page, keyset_page
from orchestra.services.personal_workspace import personal_workspace_id
from orchestra.services.shared import Shared

FIELD = "file"
MAX_FILES = 20  # file parts in one request
FLUSH_BYTES = 1024 * 1024  # buffered bytes of one part before a write is handed out (one thread hop each)
READ_CHUNK = 256 * 1024
DEFAULT_NAME = "upload"
DEFAULT_TYPE = "application/octet-stream"
NAME_MAX_CHARS = 255

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_CONTENT_TYPE = re.compile(rf"^{_TOKEN}/{_TOKEN}(\s*;[\x20-\x7e]*)?$")
_BIDI_CONTROLS = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9-]{1,64}$")
_PART_FILE = re.compile(r"^\.[A-Za-z0-9-]{1,64}\.part$")

logger = logging.getLogger("orchestra.uploads")


def body_limit(upload_max_bytes: int) -> int:
    """The most bytes one upload request may carry: MAX_FILES full files plus framing."""
    return MAX_FILES * (upload_max_bytes + 64 * 1024) + 1024 * 1024


def clean_filename(raw: str) -> str:
    """The display name kept for a client's file name.

    Directory parts (`/` or `\\`) are dropped, control and bidi-override characters
    removed, white space trimmed, NFC applied and the result cut to 255 characters
    (keeping a short extension). An empty result, `.` or `..` becomes `upload`.
    """
    name = unicodedata.normalize("NFC", raw).replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(
        ch
        for ch in name
        if unicodedata.category(ch) not in {"Cc", "Cs", "Co", "Cn"} and ch not in _BIDI_CONTROLS
    ).strip()
    if name in {"", ".", ".."}:
        return DEFAULT_NAME
    if len(name) > NAME_MAX_CHARS:
        stem, ext = os.path.splitext(name)
        name = stem[: NAME_MAX_CHARS - len(ext)] + ext if 0 < len(ext) <= 32 else name[:NAME_MAX_CHARS]
    return name


def clean_content_type(raw: str | None) -> str:
    """A part's Content-Type if it is a well-formed media type, else octet-stream."""
    value = (raw or "").strip()
    if not value or len(value) > 255 or not _CONTENT_TYPE.match(value):
        return DEFAULT_TYPE
    media, sep, params = value.partition(";")
    return media.strip().lower() + (sep + params if sep else "")


def describe(upload: Upload) -> dict[str, Any]:
    """The public shape of one stored file."""
    return {
        "file_id": upload.id,
        "filename": upload.filename,
        "size": upload.size,
        "content_type": upload.content_type,
        "sha256": upload.sha256,
        "created_at": iso(upload.created_at),
    }


def owner_dir(core: Shared, owner_id: str) -> Path:
    """`uploads/<owner_id>`; the id comes from our own token, checked to be one component."""
    if not _SAFE_COMPONENT.match(owner_id):
        raise NotFoundError("No such file.")
    return core.settings.uploads_dir / owner_id


# --- receiving ----------------------------------------------------------------------


@dataclass
class _Part:
    """One file part on its way to disk."""

    file_id: str
    filename: str
    content_type: str
    tmp_path: Path
    final_path: Path
    size: int = 0
    pieces: list[bytes | memoryview] = field(default_factory=list)  # views into chunks
    buffered: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)
    handle: BinaryIO | None = None
    done: bool = False

    started: bool = False  # loop side: the first write was handed out
    finished: bool = False  # loop side: the closing write was handed out

    def add(self, data: bytes, start: int, end: int) -> None:
        """On the event loop: keep `data[start:end]` for the next write. Chunks are
        immutable bytes, so a memoryview keeps the slice without copying it."""
        if isinstance(data, bytes):
            self.pieces.append(data if start == 0 and end == len(data) else memoryview(data)[start:end])
        else:
            self.pieces.append(bytes(data[start:end]))
        self.buffered += end - start

    def take(self) -> tuple[list[bytes | memoryview], bool] | None:
        """On the event loop: the next write to hand to a thread as (pieces, close), or
        None when nothing is due (not yet opened, finished, or a full buffer first)."""
        if self.finished:
            return None
        if self.started and not self.done and self.buffered < FLUSH_BYTES:
            return None
        pieces, self.pieces, self.buffered = self.pieces, [], 0  # hand over, no copy
        self.started, self.finished = True, self.done
        return pieces, self.done

    def write(self, pieces: list[bytes | memoryview], last: bool) -> None:
        """In a worker thread: create and lock the temp file once, hash and append; the
        last write flushes. The file stays open (and locked) until `close()`."""
        if self.handle is None:
            self.handle = _create_locked(self.tmp_path)
        for piece in pieces:
            self.hasher.update(piece)
            self.handle.write(piece)
        if last:
            self.handle.flush()

    def close(self) -> None:
        """Close the temp file, which gives up its lock (after the rename, or to remove it)."""
        if self.handle is not None and not self.handle.closed:
            self.handle.close()

    def discard(self) -> None:
        self.tmp_path.unlink(missing_ok=True)
        self.close()


def _create_locked(path: Path) -> BinaryIO:
    """Create `path` (0600, never an existing file) and hold an exclusive flock on it, so
    the start-up sweep of another process knows it is in use."""
    for attempt in (1, 2):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileNotFoundError:  # a starting worker's sweep removed the empty folder
            if attempt == 2:
                raise
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        return os.fdopen(fd, "wb")
    raise AssertionError("unreachable")


def sweep_stray_files(uploads_dir: Path) -> tuple[int, int]:
    """Remove every `uploads/<uid>/.<id>.part` no live process holds locked, then every
    per-user folder left empty. Returns (files removed, folders removed). Run at start."""
    files = folders = 0
    try:
        owners = [entry for entry in os.scandir(uploads_dir) if entry.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return 0, 0
    for owner in owners:
        try:
            entries = list(os.scandir(owner.path))
        except OSError:
            continue
        for entry in entries:
            if _PART_FILE.match(entry.name) and entry.is_file(follow_symlinks=False):
                files += _remove_if_unlocked(Path(entry.path))
        try:
            os.rmdir(owner.path)  # only succeeds when empty
        except OSError:
            continue
        folders += 1
    return files, folders


def _remove_if_unlocked(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # a live upload (this or another process) is writing it
        path.unlink(missing_ok=True)
        logger.info("removed the stray upload temp file %s", path)
        return 1
    finally:
        os.close(fd)


class _Receiver:
    """Callbacks for the push parser: routes part data into `_Part`s, checks limits."""

    def __init__(self, folder: Path, limit: int, room: int | None = None, quota: int = 0) -> None:
        self.folder = folder
        self.limit = limit
        self.room = room  # bytes the owner may still store (None: not checked here)
        self.quota = quota
        self.total = 0  # file bytes received, all parts
        self.parts: list[_Part] = []
        self.current: _Part | None = None
        self.headers: dict[str, bytes] = {}
        self._field = bytearray()
        self._value = bytearray()
        self.ended = False
        self.too_large: str | None = None
        self.too_many = False  # more than MAX_FILES file parts: a 422, as the form's maxItems says
        self.text_field_named_file = False

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": lambda d, s, e: self._field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._value.extend(d[s:e]),
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self.headers = {}
        self.current = None

    def on_header_end(self) -> None:
        self.headers[self._field.decode("latin-1").strip().lower()] = bytes(self._value).strip()
        self._field.clear()
        self._value.clear()

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get("content-disposition", b""))
        if options.get(b"name") != FIELD.encode():
            return  # another form field: its data is read and dropped
        if b"filename" not in options:
            self.text_field_named_file = True
            return
        if len(self.parts) >= MAX_FILES:
            self.too_many = True
            return
        file_id = new_id()
        part = _Part(
            file_id=file_id,
            filename=clean_filename(options[b"filename"].decode("utf-8", errors="replace")),
            content_type=clean_content_type(self.headers.get("content-type", b"").decode("latin-1")),
            tmp_path=self.folder / f".{file_id}.part",
            final_path=self.folder / file_id,
        )
        self.parts.append(part)
        self.current = part

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self.current
        if part is None or self.too_large:
            return
        part.size += end - start
        self.total += end - start
        if self.room is not None and self.total > self.room:
            self.too_large = quota_message(self.quota, self.quota - self.room, self.total)
            return
        if part.size > self.limit:
            self.too_large = (
                f"'{part.filename}' is larger than the limit of {self.limit} bytes a file."
            )
            return
        part.add(data, start, end)

    def on_part_end(self) -> None:
        if self.current is not None:
            self.current.done = True
        self.current = None

    def on_end(self) -> None:
        self.ended = True


async def receive(
    core: Shared, *, owner_id: str, content_type: str | None, chunks: AsyncIterable[bytes]
) -> list[Upload]:
    """Store every `file` part of a multipart/form-data body arriving as `chunks`.

    400 BadRequestError: not multipart/form-data, no boundary, malformed or truncated.
    413 PayloadTooLargeError: a file over `upload_max_bytes`, or a body over `body_limit`.
    422 ValidationError: no part named `file` with a file name, or more than MAX_FILES.
    On any error nothing is left behind.
    """
    limit, quota = core.settings.upload_max_bytes, core.settings.upload_quota_bytes
    folder = owner_dir(core, owner_id)
    used = await stored_bytes(core, owner_id)
    await release_connection(core.db)  # none is held while the body streams in
    parser = _parser_for(content_type, _Receiver(folder, limit, max(quota - used, 0), quota))
    receiver: _Receiver = parser.receiver  # type: ignore[attr-defined]
    received, cap = 0, body_limit(limit)
    writer = _Writer()
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > cap:
                raise PayloadTooLargeError(f"An upload request may carry at most {cap} bytes.")
            try:
                parser.write(chunk)
            except FormParserError as exc:
                raise BadRequestError(f"The multipart body is malformed: {exc}.") from None
            if receiver.too_large:
                raise PayloadTooLargeError(receiver.too_large)
            if receiver.too_many:
                raise ValidationError.field("file", f"at most {MAX_FILES} files may be sent at once")
            for part in receiver.parts:
                await writer.submit(part)
        if not receiver.ended:
            raise BadRequestError("The multipart body ended before its closing boundary.")
        if not receiver.parts:
            problem = (
                "must be a file part (with a filename), not a text field"
                if receiver.text_field_named_file
                else "no file was sent: send one or more multipart parts named 'file'"
            )
            raise ValidationError.field(FIELD, problem)
        for part in receiver.parts:
            part.done = True
            await writer.submit(part)
        await writer.wait()
        return await _commit(core, owner_id, receiver.parts)
    except BaseException:
        await writer.settle()
        for part in receiver.parts:
            part.discard()
        raise


class _Writer:
    """Runs one disk write at a time in a worker thread while the loop reads on: the
    next chunk arrives while the previous one is hashed and written (double buffering)."""

    def __init__(self) -> None:
        self.pending: asyncio.Future | None = None

    async def submit(self, part: _Part) -> None:
        job = part.take()
        if job is None:
            return
        await self.wait()
        self.pending = asyncio.ensure_future(asyncio.to_thread(part.write, *job))

    async def wait(self) -> None:
        """Wait for the write in flight; its errors (disk full) surface here."""
        if self.pending is not None:
            await asyncio.shield(self.pending)
            self.pending = None

    async def settle(self) -> None:
        """After a failure: let the thread finish (it may be creating the temp file)."""
        if self.pending is not None and not self.pending.done():
            await asyncio.wait([self.pending])


def _parser_for(content_type: str | None, receiver: _Receiver) -> MultipartParser:
    media, options = parse_options_header(content_type or "")
    if media != b"multipart/form-data":
        shown = media.decode("latin-1") or "none"
        raise BadRequestError(
            f"Send files as 'multipart/form-data' with a part named 'file' (Content-Type was {shown})."
        )
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadRequestError("The multipart Content-Type has no boundary.")
    try:
        parser = MultipartParser(boundary, receiver.callbacks())
    except FormParserError as exc:
        raise BadRequestError(f"The multipart boundary is not acceptable: {exc}.") from None
    parser.receiver = receiver  # type: ignore[attr-defined]
    return parser


def quota_message(quota: int, used: int, incoming: int) -> str:
    """The 413 sentence of a request that would pass the owner's quota."""
    return (
        f"The upload quota of {quota} bytes per user (ORCHESTRA_UPLOAD_QUOTA_BYTES) would be "
        f"exceeded: {used} bytes are stored and this request carries {incoming} more."
    )


async def stored_bytes(core: Shared, owner_id: str) -> int:
    """The bytes of all of the owner's stored uploads."""
    rows = await core.db.list(
        Upload.select(fn.COALESCE(fn.SUM(Upload.size), 0).alias("total"))
        .where(Upload.owner == owner_id)
    )
    return int(rows[0].total) if rows else 0


def _audited(upload: Upload) -> dict[str, Any]:
    """What an audit entry shows of a file (SPEC §16): never its content."""
    return {"filename": upload.filename, "size": upload.size, "content_type": upload.content_type,
            "sha256": upload.sha256}


def _target(upload: Upload) -> dict[str, Any]:
    return audit.target("file", upload.id, upload.filename)


async def _commit(core: Shared, owner_id: str, parts: list[_Part]) -> list[Upload]:
    """Check the quota, rename the finished temp files into place and record them, in one
    transaction that holds the owner's lock: concurrent uploads of one user (on any
    process) are checked one after the other, each seeing the others' files."""

    def rename_all() -> None:
        for part in parts:
            os.replace(part.tmp_path, part.final_path)
            part.close()

    incoming = sum(part.size for part in parts)
    quota = core.settings.upload_quota_bytes
    workspace_id = await personal_workspace_id(core, owner_id)  # a user's files: their audit chain
    try:
        async with core.write_transaction():
            if core.is_postgres:  # SQLite's write transaction is already exclusive
                await core.db.list(User.select(User.id).where(User.id == owner_id).for_update())
            used = await stored_bytes(core, owner_id)
            if used + incoming > quota:
                raise PayloadTooLargeError(quota_message(quota, used, incoming))
            await asyncio.to_thread(rename_all)
            rows = [
                await Upload.acreate(
                    id=part.file_id,
                    owner=owner_id,
                    filename=part.filename,
                    size=part.size,
                    content_type=part.content_type,
                    sha256=part.hasher.hexdigest(),
                )
                for part in parts
            ]
            await audit.record_many(core, [audit.Pending(
                "file.create", _target(row), audit.diff({}, _audited(row)), workspace_id) for row in rows])
            return rows
    except BaseException:
        for part in parts:
            part.final_path.unlink(missing_ok=True)
        raise


# --- reading and removing -------------------------------------------------------------


async def get_upload(core: Shared, *, owner_id: str, file_id: str) -> Upload:
    """One of the owner's files; 404 for unknown ids and for other users' files alike."""
    if not storable(file_id) or len(file_id) > 64:
        raise NotFoundError("No such file.")
    upload = await Upload.aget_or_none((Upload.id == file_id) & (Upload.owner == owner_id))
    if upload is None:
        raise NotFoundError("No such file.")
    return upload


async def list_uploads(
    core: Shared, *, owner_id: str, limit: int = DEFAULT_LIMIT, cursor: str | None = None
) -> Page[Upload]:
    """A page of the owner's files, oldest first."""
    return await keyset_page(
        core.db, Upload.select().where(Upload.owner == owner_id), kind="file",
        at=Upload.created_at, key=Upload.id, limit=limit, cursor=cursor,
    )


async def open_upload(core: Shared, *, owner_id: str, file_id: str) -> tuple[Upload, BinaryIO]:
    """The row and an open binary handle on its bytes (the caller closes it)."""
    upload = await get_upload(core, owner_id=owner_id, file_id=file_id)
    path = owner_dir(core, owner_id) / upload.id
    try:
        handle = await asyncio.to_thread(open, path, "rb")
    except FileNotFoundError:
        raise NotFoundError("The file's content is missing from the store.") from None
    return upload, handle


async def delete_upload(core: Shared, *, owner_id: str, file_id: str) -> None:
    """Remove the row, then the file."""
    upload = await get_upload(core, owner_id=owner_id, file_id=file_id)
    workspace_id = await personal_workspace_id(core, owner_id)
    async with core.write_transaction():
        if not await core.db.aexecute(Upload.delete().where(Upload.id == upload.id)):
            raise NotFoundError("No such file.")
        await audit.record(core, action="file.delete", target=_target(upload),
                           changes=audit.diff(_audited(upload), {}), workspace_id=workspace_id)
    await asyncio.to_thread((owner_dir(core, owner_id) / upload.id).unlink, missing_ok=True)


async def read_text(core: Shared, *, owner_id: str, file_id: str, max_bytes: int = 200_000) -> str:
    """The first `max_bytes` of one of the owner's files as text (UTF-8, bad bytes replaced),
    with a closing note when the file was cut. For the `read_upload` tool."""
    upload, handle = await open_upload(core, owner_id=owner_id, file_id=file_id)
    try:
        data = await asyncio.to_thread(handle.read, max_bytes)
    finally:
        handle.close()
    text = data.decode("utf-8", errors="replace")
    if upload.size > len(data):
        text += f"\n[truncated: the first {len(data)} of {upload.size} bytes are shown]"
    return text
