"""The per-user upload quota (SPEC §15, `ORCHESTRA_UPLOAD_QUOTA_BYTES`): a request that
would take a user's stored uploads past it is refused whole with 413 naming the quota,
nothing of it kept; concurrent requests of one user cannot pass it together; each user
has a quota of their own. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from orchestra.db.models import Upload

URL = "/api/v1/adapter/client/upload"
QUOTA = 100_000
COUNT = 6


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides() -> dict:
    return {"upload_quota_bytes": QUOTA, "upload_max_bytes": 64 * 1024}


def on_disk(client, user_id: str) -> list[str]:
    folder = client.app.ctx.core.settings.uploads_dir / user_id
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def stored(client, user_id: str) -> list[Upload]:
    return await client.app.ctx.core.db.list(Upload.select().where(Upload.owner == user_id))


def assert_quota_refusal(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    body = response.json()
    assert body["error"] == "PayloadTooLargeError"
    assert str(QUOTA) in body["message"] and "quota" in body["message"]


async def upload(client, user: dict, *sizes: int) -> httpx.Response:
    files = [("file", (f"f{i}.bin", b"x" * size, "application/octet-stream"))
             for i, size in enumerate(sizes)]
    return await client.post(URL, headers=user["headers"], files=files)


async def test_a_request_past_the_quota_is_refused_whole(client, users):
    alice, bob = await users.make("alice"), await users.make("bob")
    first = await upload(client, alice, 40_000, 40_000)
    assert first.status_code == 201, first.text
    kept = sorted(f["file_id"] for f in first.json()["files"])

    # 10,000 would fit, 30,000 would not: neither is kept (all or nothing).
    assert_quota_refusal(await upload(client, alice, 10_000, 30_000))
    assert on_disk(client, alice["user_id"]) == kept
    assert sorted(u.id for u in await stored(client, alice["user_id"])) == kept

    # Exactly up to the quota is allowed; one byte more is not.
    assert (await upload(client, alice, 20_000)).status_code == 201
    assert_quota_refusal(await upload(client, alice, 1))
    assert len(on_disk(client, alice["user_id"])) == 3

    # The quota is per user: bob's is untouched by alice's files.
    assert (await upload(client, bob, 60_000, 40_000)).status_code == 201

    # Deleting frees room again.
    listed = (await client.get(URL, headers=alice["headers"])).json()["files"]
    assert (await client.delete(f"{URL}/{listed[0]['file_id']}", headers=alice["headers"])).status_code == 200
    assert (await upload(client, alice, 40_000)).status_code == 201


async def test_concurrent_uploads_of_one_user_cannot_pass_the_quota_together(client, users):
    alice = await users.make("alice")
    answers = await asyncio.gather(*(upload(client, alice, 30_000) for _ in range(COUNT)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201, 201, 201, 413, 413, 413], [a.text for a in answers]
    for answer in answers:
        if answer.status_code == 413:
            assert_quota_refusal(answer)
    rows = await stored(client, alice["user_id"])
    assert sum(u.size for u in rows) == 90_000
    assert on_disk(client, alice["user_id"]) == sorted(u.id for u in rows)
