"""The uploads service on both stores: incremental multipart parsing, limits, cleanup,
ownership and `read_text`, against real files on disk."""

from __future__ import annotations

import hashlib

import pytest

from orchestra.db.models import Upload
from orchestra.errors import BadRequestError, NotFoundError, PayloadTooLargeError, ValidationError
from orchestra.services import auth, uploads

BOUNDARY = "----orchestra-test-boundary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


@pytest.fixture
def database_url(both_stores: str) -> str:
    return both_stores


@pytest.fixture
def settings_overrides() -> dict:
    return {"upload_max_bytes": 1000}


def multipart(*parts: tuple[str, str | None, bytes, str | None]) -> bytes:
    """A multipart/form-data body from (field name, filename, data, content type) parts."""
    out = bytearray()
    for name, filename, data, ctype in parts:
        out += f"--{BOUNDARY}\r\n".encode()
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"Content-Disposition: {disposition}\r\n".encode()
        if ctype:
            out += f"Content-Type: {ctype}\r\n".encode()
        out += b"\r\n" + data + b"\r\n"
    out += f"--{BOUNDARY}--\r\n".encode()
    return bytes(out)


async def chunked(body: bytes, size: int):
    for start in range(0, len(body), size):
        yield body[start : start + size]


@pytest.fixture
async def owner(core) -> str:
    user = await auth.register(core, user_name="owner", password="password-123")
    return user.id


def files_on_disk(core, owner_id: str) -> list[str]:
    folder = core.settings.uploads_dir / owner_id
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 100_000])
async def test_any_chunking_gives_the_same_files(core, owner, chunk_size):
    first, second = b"hello\r\n--not-a-boundary\r\n" * 3, bytes(range(256)) * 3
    body = multipart(("file", "a.txt", first, "text/plain"), ("file", "b.bin", second, None))
    stored = await uploads.receive(
        core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(body, chunk_size)
    )
    assert [(u.filename, u.size, u.content_type) for u in stored] == [
        ("a.txt", len(first), "text/plain"),
        ("b.bin", len(second), "application/octet-stream"),
    ]
    for upload, data in zip(stored, (first, second), strict=True):
        assert upload.sha256 == hashlib.sha256(data).hexdigest()
        path = core.settings.uploads_dir / owner / upload.id
        assert path.read_bytes() == data
    assert files_on_disk(core, owner) == sorted(u.id for u in stored)
    assert await core.db.count(Upload.select().where(Upload.owner == owner)) == 2


async def test_a_file_over_the_limit_leaves_nothing(core, owner):
    body = multipart(("file", "ok.txt", b"x" * 10, None), ("file", "big.bin", b"y" * 1001, None))
    with pytest.raises(PayloadTooLargeError):
        await uploads.receive(core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(body, 50))
    assert files_on_disk(core, owner) == []
    assert await core.db.count(Upload.select()) == 0


async def test_exactly_the_limit_is_accepted(core, owner):
    body = multipart(("file", "edge.bin", b"z" * 1000, None))
    [stored] = await uploads.receive(
        core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(body, 333)
    )
    assert stored.size == 1000


async def test_too_many_files_is_422_as_the_form_schema_says(core, owner):
    """The document's UploadForm says `maxItems: 20`: one more is a shape error, not a size."""
    body = multipart(*[("file", f"{i}.txt", b"1", None) for i in range(uploads.MAX_FILES + 1)])
    with pytest.raises(ValidationError) as refused:
        await uploads.receive(core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(body, 999))
    assert refused.value.detail[0]["field"] == "file"
    assert files_on_disk(core, owner) == []


async def test_a_truncated_body_is_400_and_leaves_nothing(core, owner):
    body = multipart(("file", "cut.txt", b"abc" * 100, None))[:-40]
    with pytest.raises(BadRequestError):
        await uploads.receive(core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(body, 64))
    assert files_on_disk(core, owner) == []
    assert await core.db.count(Upload.select()) == 0


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json", "multipart/form-data", "text/plain; boundary=x"],
)
async def test_not_multipart_is_400(core, owner, content_type):
    with pytest.raises(BadRequestError):
        await uploads.receive(
            core, owner_id=owner, content_type=content_type, chunks=chunked(b"{}", 10)
        )


async def test_no_file_part_is_422(core, owner):
    body = multipart(("other", "x.txt", b"data", None))
    with pytest.raises(ValidationError) as caught:
        await uploads.receive(core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(body, 10))
    assert caught.value.detail[0]["field"] == "file"
    text_field = multipart(("file", None, b"just text", None))
    with pytest.raises(ValidationError) as caught:
        await uploads.receive(
            core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(text_field, 10)
        )
    assert "text field" in caught.value.detail[0]["problem"]


async def test_a_client_that_goes_away_leaves_nothing(core, owner):
    body = multipart(("file", "gone.bin", b"q" * 900, None))

    async def broken():
        yield body[:500]
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await uploads.receive(core, owner_id=owner, content_type=CONTENT_TYPE, chunks=broken())
    assert files_on_disk(core, owner) == []


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("../../etc/passwd", "passwd"),
        ("..\\..\\windows\\system.ini", "system.ini"),
        ("C:\\Users\\me\\report.pdf", "report.pdf"),
        ("..", "upload"),
        ("", "upload"),
        ("a/b/", "upload"),
        ("bad\x00na\x1bme\u202e.txt", "badname.txt"),
        ("  spaced  .txt ", "spaced  .txt"),
        ("résumé 履歴書.pdf", "résumé 履歴書.pdf"),
        ("e\u0301.txt", "é.txt"),
        ("x" * 300 + ".tar.gz", "x" * 252 + ".gz"),
    ],
)
def test_clean_filename(raw, clean):
    assert uploads.clean_filename(raw) == clean


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Text/Plain; charset=utf-8", "text/plain; charset=utf-8"),
        ("image/png", "image/png"),
        ("", "application/octet-stream"),
        ("not a type", "application/octet-stream"),
        ("text/html\r\nX-Evil: 1", "application/octet-stream"),
    ],
)
def test_clean_content_type(raw, clean):
    assert uploads.clean_content_type(raw) == clean


async def test_read_text_delete_and_ownership(core, owner):
    other = (await auth.register(core, user_name="other", password="password-123")).id
    text = "ünïcode line\n".encode() * 20 + b"\xff"
    body = multipart(("file", "notes.txt", text, "text/plain"))
    [stored] = await uploads.receive(core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(body, 100))

    full = await uploads.read_text(core, owner_id=owner, file_id=stored.id)
    assert full == text.decode("utf-8", errors="replace")
    cut = await uploads.read_text(core, owner_id=owner, file_id=stored.id, max_bytes=14)
    assert cut.startswith("ünïcode line\n") and "[truncated: the first 14 of" in cut

    for call in (uploads.read_text, uploads.get_upload, uploads.delete_upload):
        with pytest.raises(NotFoundError):
            await call(core, owner_id=other, file_id=stored.id)
        for odd in ("a\x00b", "x" * 500, ""):  # never a store error, on PostgreSQL too
            with pytest.raises(NotFoundError):
                await call(core, owner_id=owner, file_id=odd)
    assert [u.id for u in (await uploads.list_uploads(core, owner_id=other)).rows] == []
    assert [u.id for u in (await uploads.list_uploads(core, owner_id=owner)).rows] == [stored.id]

    await uploads.delete_upload(core, owner_id=owner, file_id=stored.id)
    assert files_on_disk(core, owner) == []
    with pytest.raises(NotFoundError):
        await uploads.read_text(core, owner_id=owner, file_id=stored.id)


async def test_deleting_the_user_removes_the_files(core, owner):
    body = multipart(("file", "mine.txt", b"mine", None))
    await uploads.receive(core, owner_id=owner, content_type=CONTENT_TYPE, chunks=chunked(body, 100))
    assert len(files_on_disk(core, owner)) == 1
    await auth.delete_user(core, user_id=owner)
    assert not (core.settings.uploads_dir / owner).exists()
    assert await core.db.count(Upload.select()) == 0


def test_the_sweep_removes_unlocked_temp_files_and_empty_folders_only(tmp_path):
    import fcntl
    import os

    root = tmp_path / "uploads"
    dead, live, kept, empty = root / "a", root / "b", root / "c", root / "d"
    for folder in (dead, live, kept, empty):
        folder.mkdir(parents=True)
    (dead / ".1111.part").write_bytes(b"left by a killed process")
    (live / ".2222.part").write_bytes(b"being written")
    (kept / "3333").write_bytes(b"a stored file")
    (kept / ".4444.part").write_bytes(b"left behind too")
    (kept / "notes.part").write_bytes(b"not a temp file name")
    holder = os.open(live / ".2222.part", os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as a live upload holds it
    try:
        assert uploads.sweep_stray_files(root) == (2, 2)
    finally:
        os.close(holder)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "b", "b/.2222.part", "c", "c/3333", "c/notes.part"]
    assert uploads.sweep_stray_files(tmp_path / "missing") == (0, 0)
