"""API keys (SPEC §11) in process, on SQLite and PostgreSQL: created once and shown once,
stored as a hash, narrowed by scopes and templates, refused where keys never reach, and
stopped at once by revocation, expiry, a user's deletion or demotion."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest

from orchestra.db.access_models import ApiKey
from orchestra.db.models import utcnow
from orchestra.services import api_keys

KEYS = "/api/v1/auth/key"
WF = "/api/v1/workflow"


@pytest.fixture
def database_url(both_stores):
    return both_stores


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def assert_error(response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and body["message"]
    return body


async def template(client, who, name="t", shared=False) -> str:
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "Name for {{input}}?"}]
    response = await client.post(f"{WF}/template", headers=who["headers"],
                                 json={"name": name, "steps": steps, "shared": shared})
    assert response.status_code == 201, response.text
    return response.json()["template_id"]


async def make_key(client, who, **body) -> dict:
    response = await client.post(KEYS, headers=who["headers"],
                                 json={"name": "ci", "scopes": ["run:start", "run:read"], **body})
    assert response.status_code == 201, response.text
    return response.json()


async def test_create_shows_the_secret_once_and_stores_only_its_hash(client, alice):
    made = await make_key(client, alice)
    secret = made["key"]
    assert secret.startswith("orc_") and len(secret) >= 4 + 43
    info = made["key_info"]
    assert info["key_id"] == made["key_id"] and info["prefix"] == secret[4:12]
    assert info["scopes"] == ["run:start", "run:read"] and info["templates"] is None
    assert info["last_used_at"] is None and info["expires_at"] is None
    row = await ApiKey.aget(ApiKey.id == made["key_id"])
    assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(row.__data__.values())
    listed = (await client.get(KEYS, headers=alice["headers"])).json()
    assert listed["keys"] == [info] and "key" not in listed["keys"][0]


async def test_a_key_acts_as_its_user_within_its_scopes(client, alice):
    tid = await template(client, alice)
    secret = (await make_key(client, alice))["key"]
    started = await client.post(f"{WF}/run", headers=bearer(secret), json={"template_id": tid, "input": "x"})
    assert started.status_code == 202, started.text
    trace = started.json()["trace_id"]
    run = await client.get(f"{WF}/run/{trace}", headers=bearer(secret))
    assert run.status_code == 200 and run.json()["owner_id"] == alice["user_id"]
    # no run:cancel, run:reply, template:read or template:write
    assert_error(await client.post(f"{WF}/cancel/{trace}", headers=bearer(secret)), 403,
                 "PermissionDeniedError")
    assert_error(await client.post(f"{WF}/reply/{trace}", headers=bearer(secret), json={"content": "a"}),
                 403, "PermissionDeniedError")
    assert_error(await client.get(f"{WF}/template", headers=bearer(secret)), 403, "PermissionDeniedError")


async def test_keys_never_reach_admin_routes_key_management_or_providers(client, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    secret = (await make_key(client, root, scopes=list(api_keys.SCOPES)))["key"]
    for method, path, body in (
        ("GET", "/api/v1/auth/list", None),
        ("PUT", "/api/v1/auth/authority", {"user_id": root["user_id"], "new_authority": "USER"}),
        ("GET", KEYS, None),
        ("POST", KEYS, {"name": "more", "scopes": ["run:read"]}),
        ("DELETE", f"{KEYS}/whatever", None),
        ("GET", "/api/v1/provider", None),
        ("POST", "/api/v1/provider", {"name": "p", "provider": "openai", "model_id": "m"}),
    ):
        answer = await client.request(method, path, headers=bearer(secret), json=body)
        assert_error(answer, 403, "PermissionDeniedError")


async def test_templates_narrow_run_start(client, alice):
    allowed, other = await template(client, alice, "a"), await template(client, alice, "b")
    secret = (await make_key(client, alice, templates=[allowed]))["key"]
    ok = await client.post(f"{WF}/run", headers=bearer(secret), json={"template_id": allowed})
    assert ok.status_code == 202
    refused = await client.post(f"{WF}/run", headers=bearer(secret), json={"template_id": other})
    assert_error(refused, 403, "PermissionDeniedError")
    assert await run_count(client, alice) == 1


async def run_count(client, who) -> int:
    return len((await client.get(f"{WF}/run", headers=who["headers"])).json()["runs"])


async def test_bad_keys_are_422_naming_the_field(client, alice, users):
    bob = await users.make("bob")
    private = await template(client, bob, "bobs")
    shared = await template(client, bob, "open")
    for body, field in (
        ({"name": "k", "scopes": ["run:start", "admin"]}, "scopes"),
        ({"name": "k", "scopes": []}, "scopes"),
        ({"name": "k", "scopes": ["run:read"], "templates": [private]}, "templates"),
        ({"name": "k", "scopes": ["run:read"], "templates": ["no-such-id"]}, "templates"),
        ({"name": "k", "scopes": ["run:read"], "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "k", "scopes": ["run:read"], "expires_at": "tomorrow"}, "expires_at"),
        ({"name": "", "scopes": ["run:read"]}, "name"),
    ):
        answer = assert_error(await client.post(KEYS, headers=alice["headers"], json=body), 422,
                              "ValidationError")
        assert any(d["field"].split(".")[0] == field for d in answer["detail"]), answer
    core = client.app.ctx.core
    assert shared and await core.db.count(ApiKey.select().where(ApiKey.user == alice["user_id"])) == 0


async def test_revoked_expired_and_deleted_users_keys_are_401(client, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    carol = await users.make("carol")
    revoked, expiring, deleted = [(await make_key(client, carol, name=n))["key"] for n in "abc"]
    for secret in (revoked, expiring, deleted):
        assert (await client.get(f"{WF}/run", headers=bearer(secret))).status_code == 200
    key_id = next(k["key_id"] for k in (await client.get(KEYS, headers=carol["headers"])).json()["keys"]
                  if k["name"] == "a")
    assert (await client.delete(f"{KEYS}/{key_id}", headers=carol["headers"])).status_code == 200
    assert_error(await client.get(f"{WF}/run", headers=bearer(revoked)), 401, "TokenInvalidError")
    assert_error(await client.delete(f"{KEYS}/{key_id}", headers=carol["headers"]), 404, "NotFoundError")
    await client.app.ctx.core.db.aexecute(ApiKey.update(expires_at=utcnow() - dt.timedelta(seconds=1))
                                          .where(ApiKey.name == "b"))
    api_keys.key_cache(client.app.ctx.core).changed()
    assert_error(await client.get(f"{WF}/run", headers=bearer(expiring)), 401, "TokenInvalidError")
    assert (await client.delete(f"/api/v1/auth/{carol['user_id']}", headers=root["headers"])).status_code == 200
    assert_error(await client.get(f"{WF}/run", headers=bearer(deleted)), 401, "TokenInvalidError")
    assert_error(await client.get(f"{WF}/run", headers=bearer("orc_" + "x" * 43)), 401, "TokenInvalidError")


async def test_a_demoted_users_key_loses_the_rights_of_the_old_role_at_once(client, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    dave = await users.make("dave", "ADMINISTRATOR")
    secret = (await make_key(client, dave, scopes=["run:read"]))["key"]
    assert (await client.get(f"{WF}/run?all=true", headers=bearer(secret))).status_code == 200
    demoted = await client.put("/api/v1/auth/authority", headers=root["headers"],
                               json={"user_id": dave["user_id"], "new_authority": "USER"})
    assert demoted.status_code == 200
    assert_error(await client.get(f"{WF}/run?all=true", headers=bearer(secret)), 403,
                 "PermissionDeniedError")
    assert (await client.get(f"{WF}/run", headers=bearer(secret))).status_code == 200


async def test_last_used_is_recorded_at_most_once_a_minute(client, alice):
    made = await make_key(client, alice)
    for _ in range(5):
        assert (await client.get(f"{WF}/run", headers=bearer(made["key"]))).status_code == 200
    core = client.app.ctx.core
    for task in list(core.extras.get("key_touch_tasks", ())):
        await task
    first = (await ApiKey.aget(ApiKey.id == made["key_id"])).last_used_at
    assert first is not None and utcnow() - first < dt.timedelta(seconds=30)
    assert (await client.get(f"{WF}/run", headers=bearer(made["key"]))).status_code == 200
    for task in list(core.extras.get("key_touch_tasks", ())):
        await task
    assert (await ApiKey.aget(ApiKey.id == made["key_id"])).last_used_at == first
    listed = (await client.get(KEYS, headers=alice["headers"])).json()["keys"][0]
    assert listed["last_used_at"] is not None

