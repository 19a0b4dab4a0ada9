"""orchestra.services.auth on a real SQLite file: users, roles, login, refresh rotation."""

from __future__ import annotations

import asyncio
import uuid

import jwt
import pytest

from orchestra.db.models import RefreshToken, User
from orchestra.errors import (
    InvalidCredentialsError,
    LastSuperAdministratorError,
    PermissionDeniedError,
    TokenExpiredError,
    TokenInvalidError,
    UserAlreadyExistsError,
    UserNotExistError,
    ValidationError,
)
from orchestra.services import auth
from orchestra.services.roles import Role

PASSWORD = "password-123"


async def test_the_store_is_a_real_sqlite_file(core, settings):
    assert settings.database_url.startswith("sqlite:///")
    await auth.register(core, user_name="alice", password=PASSWORD)
    assert settings.database_url.split("sqlite:///", 1)[1].endswith("orchestra.db")


async def test_register_stores_a_user_with_role_user_and_an_argon2id_hash(core):
    user = await auth.register(core, user_name="alice", password=PASSWORD)
    assert str(uuid.UUID(user.id)) == user.id
    row = await User.aget(User.id == user.id)
    assert (row.user_name, row.user_name_key, row.role) == ("alice", "alice", "USER")
    assert row.password_hash.startswith("$argon2id$v=19$") and PASSWORD not in row.password_hash
    assert await core.passwords.verify(row.password_hash, PASSWORD)


async def test_register_with_a_role(core):
    user = await auth.register(core, user_name="root", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
    assert (await User.aget(User.id == user.id)).role == "SUPER_ADMINISTRATOR"


async def test_two_registrations_of_one_password_have_different_salts(core):
    a = await auth.register(core, user_name="alice", password=PASSWORD)
    b = await auth.register(core, user_name="bob", password=PASSWORD)
    assert a.password_hash != b.password_hash


@pytest.mark.parametrize(
    "raw,name,key",
    [("  Alice ", "Alice", "alice"), ("ＡＬＩＣＥ", "ALICE", "alice"), ("Straße", "Straße", "strasse"),
     ("ﬁle", "file", "file"), ("a.b-c_d@e", "a.b-c_d@e", "a.b-c_d@e")],
)
def test_normalize_user_name(raw, name, key):
    assert auth.normalize_user_name(raw) == (name, key)


@pytest.mark.parametrize(
    "raw", ["ab", "a" * 65, "a b", "a/b", "a\nb", "x\x00y", "a+b", "😀😀😀", "   ", "", "名\u200b前"]
)
def test_normalize_user_name_refuses(raw):
    with pytest.raises(ValidationError) as info:
        auth.normalize_user_name(raw)
    assert info.value.detail[0]["field"] == "user_name"


def test_name_length_counts_characters_after_normalisation():
    assert auth.normalize_user_name("  " + "é" * 64 + "  ")[0] == "é" * 64
    with pytest.raises(ValidationError):
        auth.normalize_user_name("ｘ" * 65)


def test_check_password_bounds():
    auth.check_password("p" * 8)
    auth.check_password("p" * 256)
    for bad in ("p" * 7, "p" * 257, ""):
        with pytest.raises(ValidationError):
            auth.check_password(bad)


async def test_duplicate_names_ignore_case_and_width(core):
    await auth.register(core, user_name="Alice", password=PASSWORD)
    for other in ("alice", "ALICE", " ａｌｉｃｅ "):
        with pytest.raises(UserAlreadyExistsError):
            await auth.register(core, user_name=other, password=PASSWORD)
    assert await core.db.count(User.select()) == 1


async def test_concurrent_registrations_of_one_name_store_one_user(core):
    results = await asyncio.gather(
        *(auth.register(core, user_name="racer", password=PASSWORD) for _ in range(20)),
        return_exceptions=True,
    )
    created = [r for r in results if isinstance(r, User)]
    refused = [r for r in results if isinstance(r, UserAlreadyExistsError)]
    assert len(created) == 1 and len(refused) == 19, results
    assert await core.db.count(User.select()) == 1


async def test_find_user_and_get_user(core):
    user = await auth.register(core, user_name="Alice", password=PASSWORD)
    assert (await auth.find_user(core, " ALICE ")).id == user.id
    assert (await auth.get_user(core, user.id)).user_name == "Alice"
    for name in ("bob", "", "a b", "x\x00y"):
        with pytest.raises(UserNotExistError):
            await auth.find_user(core, name)
    for user_id in (str(uuid.uuid4()), "", "x" * 100, "a\x00b"):
        with pytest.raises(UserNotExistError):
            await auth.get_user(core, user_id)


async def test_list_users_oldest_first(core):
    names = ["carol", "alice", "bob"]
    for name in names:
        await auth.register(core, user_name=name, password=PASSWORD)
    assert [u.user_name for u in await auth.list_users(core)] == names


# --- login, refresh ----------------------------------------------------------------------


async def test_login_issues_a_pair_in_a_new_family(core):
    user = await auth.register(core, user_name="alice", password=PASSWORD)
    first = await auth.login(core, user_name="alice", password=PASSWORD)
    second = await auth.login(core, user_name="ALICE", password=PASSWORD)
    rows = await core.db.list(RefreshToken.select().where(RefreshToken.user == user.id))
    assert len(rows) == 2 and rows[0].family != rows[1].family
    claims = core.tokens.decode(first.access_token, expected_type="access")
    assert claims["sub"] == user.id and claims["role"] == "USER"
    assert first.access_token != second.access_token


async def test_login_errors(core):
    await auth.register(core, user_name="alice", password=PASSWORD)
    with pytest.raises(UserNotExistError):
        await auth.login(core, user_name="nobody", password=PASSWORD)
    with pytest.raises(InvalidCredentialsError):
        await auth.login(core, user_name="alice", password="not-the-password")
    assert await core.db.count(RefreshToken.select()) == 0


async def test_refresh_rotation_and_reuse_detection(core):
    await auth.register(core, user_name="alice", password=PASSWORD)
    pair = await auth.login(core, user_name="alice", password=PASSWORD)
    second = await auth.refresh(core, refresh_token=pair.refresh_token)
    third = await auth.refresh(core, refresh_token=second.refresh_token)
    with pytest.raises(TokenInvalidError, match="already used"):
        await auth.refresh(core, refresh_token=pair.refresh_token)
    with pytest.raises(TokenInvalidError, match="revoked"):
        await auth.refresh(core, refresh_token=third.refresh_token)
    rows = await core.db.list(RefreshToken.select())
    assert len(rows) == 3 and all(r.revoked for r in rows)


async def test_refresh_refuses_access_tokens_and_expired_ones(core, settings):
    await auth.register(core, user_name="alice", password=PASSWORD)
    pair = await auth.login(core, user_name="alice", password=PASSWORD)
    with pytest.raises(TokenInvalidError):
        await auth.refresh(core, refresh_token=pair.access_token)
    claims = jwt.decode(pair.refresh_token, settings.secret_key, algorithms=["HS256"])
    claims.update(iat=claims["iat"] - 10_000_000, exp=claims["iat"] - 1)
    with pytest.raises(TokenExpiredError):
        await auth.refresh(core, refresh_token=jwt.encode(claims, settings.secret_key, algorithm="HS256"))


async def test_concurrent_refreshes_let_exactly_one_through(core):
    await auth.register(core, user_name="alice", password=PASSWORD)
    pair = await auth.login(core, user_name="alice", password=PASSWORD)
    results = await asyncio.gather(
        *(auth.refresh(core, refresh_token=pair.refresh_token) for _ in range(20)), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, auth.TokenPair)]
    assert len(winners) == 1, results
    assert all(isinstance(r, TokenInvalidError) for r in results if r is not winners[0])
    with pytest.raises(TokenInvalidError):  # the family is dead: successor included
        await auth.refresh(core, refresh_token=winners[0].refresh_token)


# --- roles ---------------------------------------------------------------------------------


async def test_set_role_revokes_sessions_and_keeps_a_super_administrator(core):
    root = await auth.register(core, user_name="root", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
    bob = await auth.register(core, user_name="bob", password=PASSWORD)
    pair = await auth.login(core, user_name="bob", password=PASSWORD)
    updated = await auth.set_role(core, user_id=bob.id, new_role=Role.ADMINISTRATOR)
    assert updated.role == "ADMINISTRATOR"
    assert (await User.aget(User.id == bob.id)).role == "ADMINISTRATOR"
    with pytest.raises(TokenInvalidError, match="revoked"):
        await auth.refresh(core, refresh_token=pair.refresh_token)
    with pytest.raises(LastSuperAdministratorError):
        await auth.set_role(core, user_id=root.id, new_role=Role.USER)
    await auth.set_role(core, user_id=bob.id, new_role=Role.SUPER_ADMINISTRATOR)
    await auth.set_role(core, user_id=root.id, new_role=Role.USER)
    assert await auth.count_super_administrators(core) == 1
    with pytest.raises(UserNotExistError):
        await auth.set_role(core, user_id=str(uuid.uuid4()), new_role=Role.USER)


async def test_delete_user_removes_tokens_files_and_calls_hooks(core, settings):
    root = await auth.register(core, user_name="root", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
    bob = await auth.register(core, user_name="bob", password=PASSWORD)
    pair = await auth.login(core, user_name="bob", password=PASSWORD)
    folder = settings.uploads_dir / bob.id
    folder.mkdir(parents=True)
    (folder / "f").write_text("data")
    seen = []

    async def hook(user_id):
        seen.append(user_id)

    core.on_user_deleted.append(hook)
    await auth.delete_user(core, user_id=bob.id)
    assert await User.aget_or_none(User.id == bob.id) is None
    assert await core.db.count(RefreshToken.select()) == 0
    assert not folder.exists() and seen == [bob.id]
    with pytest.raises(TokenInvalidError):
        await auth.refresh(core, refresh_token=pair.refresh_token)
    with pytest.raises(LastSuperAdministratorError):
        await auth.delete_user(core, user_id=root.id)
    with pytest.raises(UserNotExistError):
        await auth.delete_user(core, user_id=bob.id)


async def test_set_password_revokes_sessions(core):
    user = await auth.register(core, user_name="alice", password=PASSWORD)
    pair = await auth.login(core, user_name="alice", password=PASSWORD)
    with pytest.raises(ValidationError):
        await auth.set_password(core, user_id=user.id, password="short")
    await auth.set_password(core, user_id=user.id, password="another-password")
    with pytest.raises(TokenInvalidError):
        await auth.refresh(core, refresh_token=pair.refresh_token)
    with pytest.raises(InvalidCredentialsError):
        await auth.login(core, user_name="alice", password=PASSWORD)
    await auth.login(core, user_name="alice", password="another-password")


async def test_confirm_role_reads_the_store(core):
    root = await auth.register(core, user_name="root", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
    admin = await auth.register(core, user_name="admin", password=PASSWORD, role=Role.ADMINISTRATOR)
    assert (await auth.confirm_role(core, user_id=root.id, minimum=Role.SUPER_ADMINISTRATOR)).id == root.id
    await auth.confirm_role(core, user_id=admin.id, minimum=Role.ADMINISTRATOR)
    with pytest.raises(PermissionDeniedError):
        await auth.confirm_role(core, user_id=admin.id, minimum=Role.SUPER_ADMINISTRATOR)
    with pytest.raises(TokenInvalidError):
        await auth.confirm_role(core, user_id=str(uuid.uuid4()), minimum=Role.USER)


def test_parse_role():
    assert auth.parse_role("ADMINISTRATOR") is Role.ADMINISTRATOR
    with pytest.raises(ValidationError) as info:
        auth.parse_role("admin")
    assert info.value.detail == [
        {"field": "new_authority", "problem": "must be one of USER, ADMINISTRATOR, SUPER_ADMINISTRATOR"}
    ]


async def test_prune_expired_tokens(core):
    await auth.register(core, user_name="alice", password=PASSWORD)
    await auth.login(core, user_name="alice", password=PASSWORD)
    await auth.login(core, user_name="alice", password=PASSWORD)
    await core.db.aexecute(RefreshToken.update(expires_at=RefreshToken.created_at).where(
        RefreshToken.jti == (await core.db.list(RefreshToken.select()))[0].jti))
    assert await auth.prune_expired_tokens(core) == 1
    assert await core.db.count(RefreshToken.select()) == 1
