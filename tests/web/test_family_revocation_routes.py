"""Revoking a refresh family stops its access tokens at once (SPEC §2, §15), through the
in-process client on SQLite AND PostgreSQL: from the server's copy of the user table
and without one; by reuse and by a password change; tokens with and without `fam`."""

from __future__ import annotations

import time

import jwt
import pytest

from orchestra.services import auth as auth_service
from tests.web.test_auth_routes import (
    SECRET,
    assert_error,
    bearer,
    claims_for,
    forge,
    login,
    refresh,
)

AUTH = "/api/v1/auth"


@pytest.fixture
def database_url(both_stores):
    return both_stores


FILES = "/api/v1/adapter/client/upload"  # a USER route: the token works or it does not


async def test_a_reused_refresh_token_stops_its_familys_access_tokens_at_once(client, users):
    # root lists the users between requests, so the server answers from its copy of the
    # user table (no store round trip); alice's route re-reads her row instead: both paths.
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    alice = await users.make("alice")
    other_session = (await login(client, "alice")).json()
    rotated = (await refresh(client, alice["refresh_token"])).json()
    assert jwt.decode(rotated["access_token"], SECRET, algorithms=["HS256"])["fam"] == \
        jwt.decode(alice["access_token"], SECRET, algorithms=["HS256"])["fam"]
    root_rotated = (await refresh(client, root["refresh_token"])).json()
    for headers in (alice["headers"], bearer(rotated["access_token"])):
        assert (await client.get(FILES, headers=headers)).status_code == 200
    assert (await client.get(f"{AUTH}/list", headers=root["headers"])).status_code == 200

    assert_error(await refresh(client, alice["refresh_token"]), 401, "TokenInvalidError")
    assert_error(await refresh(client, root["refresh_token"]), 401, "TokenInvalidError")
    # Every access token of the two families is refused by the very next request ...
    for headers in (alice["headers"], bearer(rotated["access_token"])):
        body = assert_error(await client.get(FILES, headers=headers), 401, "TokenInvalidError")
        assert "revoked" in body["message"]
    for token in (root["access_token"], root_rotated["access_token"]):
        assert_error(await client.get(f"{AUTH}/list", headers=bearer(token)), 401, "TokenInvalidError")
    # ... while alice's other login (another family) goes on.
    assert (await client.get(FILES, headers=bearer(other_session["access_token"]))).status_code == 200
    root_again = (await login(client, "root")).json()
    assert (await client.get(f"{AUTH}/list", headers=bearer(root_again["access_token"]))).status_code == 200
    assert_error(await client.get(f"{AUTH}/list", headers=root["headers"]), 401, "TokenInvalidError")


async def test_a_password_change_stops_every_access_token_of_the_user(client, users):
    alice = await users.make("alice")
    bob = await users.make("bob")
    await auth_service.set_password(client.app.ctx.core, user_id=alice["user_id"], password="another-password")
    assert_error(await client.get(FILES, headers=alice["headers"]), 401, "TokenInvalidError")
    assert (await client.get(FILES, headers=bob["headers"])).status_code == 200
    fresh = (await login(client, "alice", "another-password")).json()
    assert (await client.get(FILES, headers=bearer(fresh["access_token"]))).status_code == 200


async def test_an_access_token_without_a_family_stops_when_its_users_family_is_revoked(client, users):
    """Tokens minted before access tokens named their family (no `fam`) keep working
    until one of their user's families is revoked after they were issued."""
    alice = await users.make("alice")
    bob = await users.make("bob")
    older = bearer(forge(claims_for(alice, role="USER", iat=int(time.time()) - 5)))
    bobs_older = bearer(forge(claims_for(bob, role="USER")))
    assert (await client.get(FILES, headers=older)).status_code == 200
    rotated = (await refresh(client, alice["refresh_token"])).json()
    assert_error(await refresh(client, alice["refresh_token"]), 401, "TokenInvalidError")
    assert_error(await client.get(FILES, headers=older), 401, "TokenInvalidError")
    assert_error(await client.get(FILES, headers=bearer(rotated["access_token"])), 401, "TokenInvalidError")
    assert (await client.get(FILES, headers=bobs_older)).status_code == 200
