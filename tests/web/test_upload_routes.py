"""`/api/v1/adapter/client/upload`: upload, list, download, delete, and every error path,
in process and against a real `orchestra serve` process (streamed bodies)."""

from __future__ import annotations

import hashlib
from urllib.parse import unquote

import httpx
import pytest

from orchestra.db.models import Upload
from tests.conftest import ServerProcess

URL = "/api/v1/adapter/client/upload"
LIMIT = 64 * 1024


@pytest.fixture
def settings_overrides() -> dict:
    return {"upload_max_bytes": LIMIT}


def on_disk(client, user_id: str) -> list[str]:
    folder = client.app.ctx.core.settings.uploads_dir / user_id
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def assert_error(response: httpx.Response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and body["message"]
    return body


async def test_upload_two_files_list_download_delete(client, users):
    alice = await users.make("alice")
    first, second = b"first file\n" * 100, bytes(range(256)) * 40
    response = await client.post(
        URL,
        headers=alice["headers"],
        files=[("file", ("a.txt", first, "text/plain")), ("file", ("b.bin", second, "image/png"))],
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["message"] == "success"
    assert [set(f) for f in body["files"]] == [
        {"file_id", "filename", "size", "content_type", "sha256"}
    ] * 2
    a, b = body["files"]
    assert (a["filename"], a["size"], a["content_type"]) == ("a.txt", len(first), "text/plain")
    assert (b["filename"], b["size"], b["content_type"]) == ("b.bin", len(second), "image/png")
    assert a["sha256"] == hashlib.sha256(first).hexdigest()
    assert b["sha256"] == hashlib.sha256(second).hexdigest()
    assert on_disk(client, alice["user_id"]) == sorted([a["file_id"], b["file_id"]])

    listed = await client.get(URL, headers=alice["headers"])
    assert listed.status_code == 200
    assert [f["file_id"] for f in listed.json()["files"]] == [a["file_id"], b["file_id"]]
    assert listed.json()["files"][0]["created_at"].endswith("Z")

    download = await client.get(f"{URL}/{b['file_id']}", headers=alice["headers"])
    assert download.status_code == 200
    assert download.content == second
    assert hashlib.sha256(download.content).hexdigest() == b["sha256"]
    assert download.headers["content-type"] == "image/png"
    assert download.headers["content-length"] == str(len(second))
    assert download.headers["x-content-type-options"] == "nosniff"
    assert download.headers["content-disposition"].startswith("attachment;")

    deleted = await client.delete(f"{URL}/{a['file_id']}", headers=alice["headers"])
    assert deleted.status_code == 200 and deleted.json() == {"message": "success"}
    assert on_disk(client, alice["user_id"]) == [b["file_id"]]
    assert await Upload.aget_or_none(Upload.id == a["file_id"]) is None
    assert_error(await client.get(f"{URL}/{a['file_id']}", headers=alice["headers"]), 404, "NotFoundError")
    assert_error(await client.delete(f"{URL}/{a['file_id']}", headers=alice["headers"]), 404, "NotFoundError")


async def test_path_traversal_name_is_only_a_name(client, users):
    alice = await users.make("alice")
    response = await client.post(
        URL, headers=alice["headers"], files={"file": ("../../etc/passwd", b"root:x:0:0", "text/plain")}
    )
    assert response.status_code == 201, response.text
    [stored] = response.json()["files"]
    assert stored["filename"] == "passwd"
    home = client.app.ctx.core.settings.home
    assert (home / "uploads" / alice["user_id"] / stored["file_id"]).read_bytes() == b"root:x:0:0"
    assert not (home / "etc").exists() and not (home / "uploads" / "etc").exists()
    row = await Upload.aget(Upload.id == stored["file_id"])
    assert row.filename == "passwd"


async def test_empty_file_is_accepted(client, users):
    alice = await users.make("alice")
    response = await client.post(URL, headers=alice["headers"], files={"file": ("empty.txt", b"", "text/plain")})
    assert response.status_code == 201, response.text
    [stored] = response.json()["files"]
    assert stored["size"] == 0
    assert stored["sha256"] == hashlib.sha256(b"").hexdigest()
    download = await client.get(f"{URL}/{stored['file_id']}", headers=alice["headers"])
    assert download.status_code == 200 and download.content == b""


async def test_unicode_names_round_trip(client, users):
    alice = await users.make("alice")
    name = "résumé 履歴書 📄 (v2).pdf"
    response = await client.post(URL, headers=alice["headers"], files={"file": (name, b"%PDF-1.7", "application/pdf")})
    assert response.status_code == 201, response.text
    [stored] = response.json()["files"]
    assert stored["filename"] == name
    download = await client.get(f"{URL}/{stored['file_id']}", headers=alice["headers"])
    disposition = download.headers["content-disposition"]
    assert disposition.isascii()
    assert unquote(disposition.split("filename*=UTF-8''", 1)[1]) == name
    assert 'filename="resume   (v2).pdf"' in disposition


async def test_over_the_limit_is_413_and_leaves_nothing(client, users):
    alice = await users.make("alice")
    response = await client.post(
        URL,
        headers=alice["headers"],
        files=[("file", ("ok.txt", b"fine", "text/plain")), ("file", ("big.bin", b"x" * (LIMIT + 1), None))],
    )
    body = assert_error(response, 413, "PayloadTooLargeError")
    assert "big.bin" in body["message"]
    assert on_disk(client, alice["user_id"]) == []
    assert await client.app.ctx.core.db.count(Upload.select()) == 0
    listed = await client.get(URL, headers=alice["headers"])
    assert listed.json()["files"] == []


async def test_another_users_file_is_404(client, users):
    alice, bob = await users.make("alice"), await users.make("bob")
    response = await client.post(URL, headers=alice["headers"], files={"file": ("a.txt", b"alice's", None)})
    file_id = response.json()["files"][0]["file_id"]
    assert_error(await client.get(f"{URL}/{file_id}", headers=bob["headers"]), 404, "NotFoundError")
    assert_error(await client.delete(f"{URL}/{file_id}", headers=bob["headers"]), 404, "NotFoundError")
    assert (await client.get(URL, headers=bob["headers"])).json()["files"] == []
    assert on_disk(client, alice["user_id"]) == [file_id]
    for odd in ("does-not-exist", "a%00b", "x" * 300):
        assert_error(await client.get(f"{URL}/{odd}", headers=alice["headers"]), 404, "NotFoundError")


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_no_token_is_401(client, method):
    response = await client.request(method, URL, files={"file": ("a.txt", b"x", None)} if method == "POST" else None)
    assert_error(response, 401, "AuthenticationRequiredError")
    for path_method in ("GET", "DELETE"):
        assert_error(await client.request(path_method, f"{URL}/x"), 401, "AuthenticationRequiredError")


async def test_not_multipart_is_400(client, users):
    alice = await users.make("alice")
    assert_error(await client.post(URL, headers=alice["headers"], json={"file": "x"}), 400, "BadRequestError")
    assert_error(await client.post(URL, headers=alice["headers"], content=b"raw"), 400, "BadRequestError")
    broken = await client.post(
        URL,
        headers={**alice["headers"], "Content-Type": "multipart/form-data; boundary=abc"},
        content=b"--abc\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nno end",
    )
    assert_error(broken, 400, "BadRequestError")
    assert on_disk(client, alice["user_id"]) == []


async def test_no_file_field_is_422(client, users):
    alice = await users.make("alice")
    response = await client.post(URL, headers=alice["headers"], files={"document": ("a.txt", b"x", None)})
    body = assert_error(response, 422, "ValidationError")
    assert body["detail"][0]["field"] == "file"
    text_only = await client.post(
        URL, headers=alice["headers"], data={"file": "not a file"}, files={"other": ("o.txt", b"o", None)}
    )
    assert "text field" in assert_error(text_only, 422, "ValidationError")["detail"][0]["problem"]
    assert on_disk(client, alice["user_id"]) == []


async def test_deleted_users_token_cannot_upload(client, users):
    alice = await users.make("alice")
    from orchestra.services import auth

    await auth.delete_user(client.app.ctx.core, user_id=alice["user_id"])
    response = await client.post(URL, headers=alice["headers"], files={"file": ("a.txt", b"x", None)})
    assert_error(response, 401, "TokenInvalidError")
    assert on_disk(client, alice["user_id"]) == []


# --- a real server process: streamed bodies through Sanic's HTTP/1 stack ---------------


@pytest.fixture
def upload_server(tmp_path):
    proc = ServerProcess(tmp_path / "home", env={"ORCHESTRA_UPLOAD_MAX_BYTES": str(3 * 1024 * 1024)}).start()
    yield proc
    proc.stop()


def _login(server: ServerProcess) -> dict:
    created = server.cli("user", "create", "streamer", "--password-stdin", input="password-123\n")
    assert created.returncode == 0, created.stderr
    response = httpx.post(
        f"{server.base_url}/api/v1/auth/login", json={"user_name": "streamer", "password": "password-123"}
    )
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def _streamed_body(boundary: str, name: str, size: int, chunk: int = 64 * 1024):
    yield (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    block = bytes(range(256)) * (chunk // 256)
    sent = 0
    while sent < size:
        piece = block[: min(chunk, size - sent)]
        sent += len(piece)
        yield piece
    yield f"\r\n--{boundary}--\r\n".encode()


def test_streamed_uploads_over_1_mib_work_and_over_the_limit_is_413(upload_server):
    headers = _login(upload_server)
    boundary = "bench-boundary-7d1f"
    headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    size = 2 * 1024 * 1024 + 17  # past the 1 MiB JSON limit, under the 3 MiB upload limit
    with httpx.Client(base_url=upload_server.base_url, timeout=30) as http:
        ok = http.post(URL, headers=headers, content=_streamed_body(boundary, "big.bin", size))
        assert ok.status_code == 201, ok.text
        [stored] = ok.json()["files"]
        expected = hashlib.sha256(b"".join(list(_streamed_body(boundary, "x", size))[1:-1])).hexdigest()
        assert stored["size"] == size and stored["sha256"] == expected
        download = http.get(f"{URL}/{stored['file_id']}", headers=headers)
        assert hashlib.sha256(download.content).hexdigest() == expected

        too_big = http.post(URL, headers=headers, content=_streamed_body(boundary, "huge.bin", 5 * 1024 * 1024))
        assert_error(too_big, 413, "PayloadTooLargeError")

        json_limit = http.post(
            "/api/v1/auth/login", json={"user_name": "streamer", "password": "p" * (2 * 1024 * 1024)}
        )
        assert_error(json_limit, 413, "PayloadTooLargeError")
        listed = http.get(URL, headers=headers).json()["files"]
    assert [f["file_id"] for f in listed] == [stored["file_id"]]
    folder = upload_server.home / "uploads"
    [user_dir] = list(folder.iterdir())
    assert sorted(p.name for p in user_dir.iterdir()) == [stored["file_id"]]
