"""Users, passwords and token pairs: the rules of seed §4 and SPEC §2."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import shutil
import unicodedata
import uuid
from dataclasses import dataclass

from peewee import IntegrityError, fn

from orchestra.db.database import release_connection
from orchestra.db.models import RefreshToken, User, storable, utcnow
from orchestra.errors import (
    InvalidCredentialsError,
    LastSuperAdministratorError,
    PermissionDeniedError,
    TokenInvalidError,
    UserAlreadyExistsError,
    UserNotExistError,
    ValidationError,
)
from orchestra.services import audit
from orchestra.services.personal_workspace import personal_workspace
from orchestra.services.roles import ROLE_NAMES, Role
from orchestra.services.shared import Shared
from orchestra.services.tokens import ACCESS, REFRESH
from orchestra.services.user_snapshot import UserCopy, naive_utc

USER_NAME_PATTERN = re.compile(r"^[\w.@-]+$")
USER_NAME_LENGTH = (3, 64)
PASSWORD_LENGTH = (8, 256)


@dataclass(frozen=True)
class TokenPair:
    access_token: str
    refresh_token: str


# --- validation -----------------------------------------------------------------


def normalize_user_name(raw: str) -> tuple[str, str]:
    """(display name, uniqueness key): NFKC, stripped, checked; the key is casefolded."""
    name = unicodedata.normalize("NFKC", raw).strip()
    low, high = USER_NAME_LENGTH
    if not low <= len(name) <= high:
        raise ValidationError.field("user_name", f"must be {low} to {high} characters long")
    if not USER_NAME_PATTERN.fullmatch(name) or "\n" in name:
        raise ValidationError.field(
            "user_name", "may contain only letters, digits and the characters _ . - @"
        )
    return name, name.casefold()


def check_password(password: str) -> None:
    low, high = PASSWORD_LENGTH
    if not low <= len(password) <= high:
        raise ValidationError.field("password", f"must be {low} to {high} characters long")


def parse_role(value: str, field: str = "new_authority") -> Role:
    try:
        return Role(value)
    except ValueError:
        raise ValidationError.field(field, f"must be one of {', '.join(ROLE_NAMES)}") from None


# --- users ------------------------------------------------------------------------


async def register(core: Shared, *, user_name: str, password: str, role: Role = Role.USER) -> User:
    """Store a new user with an argon2id hash of the password; returns the user."""
    name, key = normalize_user_name(user_name)
    check_password(password)
    core.passwords.ensure_capacity()  # overloaded: 503 before any store work
    if await User.aget_or_none(User.user_name_key == key) is not None:
        raise UserAlreadyExistsError(f"The user name '{name}' is taken.")
    await release_connection(core.db)  # argon2 may queue for seconds: free the pooled connection
    password_hash = await core.passwords.hash(password)
    try:
        user = await User.acreate(
            user_name=name, user_name_key=key, password_hash=password_hash, role=role.value
        )
    except IntegrityError:  # lost a race with a concurrent registration of the same name
        raise UserAlreadyExistsError(f"The user name '{name}' is taken.") from None
    await personal_workspace(core, user.id, user.user_name)  # SPEC §16: made with the user
    core.user_snapshot.changed()
    return user


async def get_user(core: Shared, user_id: str) -> User:
    """The user with this id, or UserNotExistError."""
    # An id that cannot exist is not sent to the store (PostgreSQL refuses NUL in text).
    user = None
    if len(user_id) <= 36 and storable(user_id):
        user = await User.aget_or_none(User.id == user_id)
    if user is None:
        raise UserNotExistError(f"No user has the id '{user_id[:80]}'.")
    return user


async def find_user(core: Shared, user_name: str) -> User:
    """The user with this name (case-insensitive), or UserNotExistError."""
    try:
        _, key = normalize_user_name(user_name)
    except ValidationError:  # a name that could not be registered cannot exist
        user = None
    else:
        user = await User.aget_or_none(User.user_name_key == key)
    if user is None:
        raise UserNotExistError(f"No user is named '{user_name.strip()[:80]}'.")
    return user


async def list_users(core: Shared, *, confirmed: UserCopy | None = None) -> list[User]:
    """Every user, oldest first (re-read only when the store has changed). `confirmed`:
    the copy this request's role check was just answered from (`confirm_caller`), so the
    store's version is not probed twice in one request."""
    if confirmed is not None:
        return list(confirmed.users)
    return list(await core.user_snapshot.users(core.db))


async def set_role(core: Shared, *, user_id: str, new_role: Role) -> User:
    """Change a user's authority, keeping at least one super administrator."""
    async with core.write_transaction():
        user = await get_user(core, user_id)
        if user.role == Role.SUPER_ADMINISTRATOR and new_role != Role.SUPER_ADMINISTRATOR:
            await _ensure_not_last_super_administrator(core, "demote")
        before, user.role = user.role, new_role.value
        await user.asave(only=[User.role])
        await audit.record(core, action="user.authority", target=audit.target("user", user.id, user.user_name),
                           changes={"role": audit.change(before, user.role)})
    core.user_snapshot.changed()
    await revoke_all_tokens(core, user.id)
    return user


async def delete_user(core: Shared, *, user_id: str) -> User:
    """Delete a user and everything the user owns, files included."""
    async with core.write_transaction():
        user = await get_user(core, user_id)
        if user.role == Role.SUPER_ADMINISTRATOR:
            await _ensure_not_last_super_administrator(core, "delete")
        await core.db.aexecute(User.delete().where(User.id == user.id))
        await audit.record(core, action="user.delete", target=audit.target("user", user.id, user.user_name),
                           changes={"user_name": audit.change(user.user_name, None),
                                    "role": audit.change(user.role, None)})
    core.user_snapshot.changed()
    await release_connection(core.db)  # removing the files may take a while
    await asyncio.to_thread(shutil.rmtree, core.settings.uploads_dir / user.id, ignore_errors=True)
    for hook in core.on_user_deleted:
        await hook(user.id)
    return user


async def set_password(core: Shared, *, user_id: str, password: str) -> None:
    """Replace a user's password and end every session the user has."""
    check_password(password)
    user = await get_user(core, user_id)
    await release_connection(core.db)
    user.password_hash = await core.passwords.hash(password)
    await user.asave(only=[User.password_hash])
    await revoke_all_tokens(core, user.id, stop_access=True)


async def _ensure_not_last_super_administrator(core: Shared, verb: str) -> None:
    query = User.select(User.id).where(User.role == Role.SUPER_ADMINISTRATOR.value)
    if core.is_postgres:  # lock the rows so two concurrent demotions cannot both pass
        query = query.for_update()
    admins = await core.db.list(query)
    if len(admins) <= 1:
        raise LastSuperAdministratorError(
            f"Cannot {verb} the last SUPER_ADMINISTRATOR; promote another user first."
        )


async def count_super_administrators(core: Shared) -> int:
    return await core.db.count(User.select().where(User.role == Role.SUPER_ADMINISTRATOR.value))


async def confirm_role(
    core: Shared, *, user_id: str, minimum: Role, family: str | None = None,
    issued_at: float = 0.0,
) -> User:
    """`confirm_caller`'s user."""
    user, _ = await confirm_caller(core, user_id=user_id, minimum=minimum, family=family,
                                   issued_at=issued_at)
    return user


async def confirm_caller(
    core: Shared, *, user_id: str, minimum: Role, family: str | None = None,
    issued_at: float = 0.0,
) -> tuple[User, UserCopy | None]:
    """Re-read the caller from the store: a deleted or demoted user's token stops at once,
    and so does an access token whose refresh family was revoked (reuse detected, password
    changed). From the in-process copy while the store has not changed since it was
    taken; else one query reads the user and the family's state together.

    `family` is the token's `fam` claim; a token minted before families were named has
    none, and is refused when any of its user's families was revoked after it was issued
    (such tokens are all expired one access lifetime after the upgrade).
    Also the in-process copy it was answered from (None when it read the store)."""
    current = core.user_snapshot.current()  # the store's state, when nothing changed since
    if current is not None:
        user = current.by_id.get(user_id)
        revoked = user is not None and current.access_revoked(user_id, family, issued_at)
    else:
        user, revoked = await _user_and_revocation(core, user_id, family, issued_at)
    if user is None:
        raise TokenInvalidError("The token's user no longer exists.")
    if revoked:
        raise TokenInvalidError("The token's session has been revoked; log in again.")
    if not Role(user.role).at_least(minimum):
        raise PermissionDeniedError(f"This operation needs the role {minimum.value}.")
    return user, current


async def _user_and_revocation(
    core: Shared, user_id: str, family: str | None, issued_at: float
) -> tuple[User | None, bool]:
    """The user and whether the token's family was revoked, in one round trip."""
    revocations = RefreshToken.select(RefreshToken.jti).where(
        RefreshToken.access_revoked_at.is_null(False)
        & ((RefreshToken.family == family) if family is not None
           else ((RefreshToken.user == user_id)
                 & (RefreshToken.access_revoked_at >= naive_utc(issued_at))))
    ).limit(1)
    rows = await core.db.list(
        User.select(User, fn.EXISTS(revocations).alias("access_revoked")).where(User.id == user_id)
    )
    if not rows:
        return None, False
    return rows[0], bool(rows[0].access_revoked)


# --- login and tokens ---------------------------------------------------------------


async def login(core: Shared, *, user_name: str, password: str) -> TokenPair:
    """Verify the password and issue a token pair in a new refresh family."""
    core.passwords.ensure_capacity()  # overloaded: 503 before any store work
    try:
        user = await find_user(core, user_name)
    except UserNotExistError:
        await _login_failed(core, None, user_name, "no such user")
        raise
    await release_connection(core.db)  # argon2 may queue for seconds: free the pooled connection
    if not await core.passwords.verify(user.password_hash, password):
        await _login_failed(core, user.id, user.user_name, "wrong password")
        raise InvalidCredentialsError("The password is wrong.")
    if core.passwords.needs_rehash(user.password_hash):
        user.password_hash = await core.passwords.hash(password)
        await user.asave(only=[User.password_hash])
    async with core.write_transaction():
        pair = await _issue_pair(core, user, family=uuid.uuid4().hex)
        await audit.record(core, action="auth.login", target=audit.target("user", user.id, user.user_name),
                           actor=audit.Actor(user.id, user.user_name))
    return pair


async def _login_failed(core: Shared, user_id: str | None, user_name: str, reason: str) -> None:
    """The instance-level entry of a refused login (it changes nothing else)."""
    name = user_name.strip()[:128] if isinstance(user_name, str) and storable(user_name) else None
    await audit.record(core, action="auth.login_failed", target=audit.target("user", user_id, name),
                       actor=audit.Actor(user_id, name), changes={"reason": audit.change(None, reason)})


async def refresh(core: Shared, *, refresh_token: str) -> TokenPair:
    """Rotate a refresh token: single use; a reused one revokes its whole family."""
    claims = core.tokens.decode(refresh_token, expected_type=REFRESH)
    jti = claims["jti"]
    # Claim and successor commit together: a concurrent reuse waits on the claim's row
    # lock, finds it used, and then revokes the family *including* the successor.
    async with core.write_transaction():
        claimed = await core.db.aexecute(
            RefreshToken.update(used_at=utcnow()).where(
                (RefreshToken.jti == jti)
                & RefreshToken.used_at.is_null()
                & (RefreshToken.revoked == False)  # noqa: E712 - peewee expression
            )
        )
        row = await RefreshToken.aget_or_none(RefreshToken.jti == jti)
        if claimed:
            user = await User.aget_or_none(User.id == claims["sub"])
            if user is None:
                raise TokenInvalidError("The token's user no longer exists.")
            return await _issue_pair(core, user, family=row.family)
    if row is None:
        raise TokenInvalidError("The refresh token is not known (or its user was deleted).")
    if row.revoked:
        raise TokenInvalidError("The refresh token has been revoked.")
    await _revoke_family(core, row.family)
    raise TokenInvalidError(
        "The refresh token was already used; every token of its session is now revoked."
    )


async def _issue_pair(core: Shared, user: User, *, family: str) -> TokenPair:
    access = core.tokens.issue(
        user_id=user.id, name=user.user_name, role=user.role, token_type=ACCESS, family=family
    )
    refresh_token = core.tokens.issue(
        user_id=user.id, name=user.user_name, role=user.role, token_type=REFRESH
    )
    await RefreshToken.acreate(
        jti=refresh_token.jti,
        family=family,
        user=user.id,
        expires_at=dt.datetime.fromtimestamp(refresh_token.expires_at, dt.UTC).replace(
            tzinfo=None
        ),
    )
    return TokenPair(access.token, refresh_token.token)


async def _revoke_family(core: Shared, family: str) -> None:
    """A used refresh token came back: end the family, its access tokens included, on
    every process (the update changes the store's version; on PostgreSQL a trigger
    signals it)."""
    await core.db.aexecute(
        RefreshToken.update(revoked=True, access_revoked_at=fn.COALESCE(
            RefreshToken.access_revoked_at, utcnow()
        )).where(RefreshToken.family == family)
    )
    core.user_snapshot.changed()


async def revoke_all_tokens(core: Shared, user_id: str, *, stop_access: bool = False) -> None:
    """End every refresh family of a user (role change, password change). With
    `stop_access` (password change) the families' access tokens stop at once too; after
    a role change they keep working, at the lower of their role and the stored one."""
    update = {"revoked": True}
    if stop_access:
        update["access_revoked_at"] = fn.COALESCE(RefreshToken.access_revoked_at, utcnow())
    await core.db.aexecute(RefreshToken.update(**update).where(RefreshToken.user == user_id))
    if stop_access:
        core.user_snapshot.changed()


async def prune_expired_tokens(core: Shared, *, now: dt.datetime | None = None) -> int:
    """Forget refresh tokens past their expiry (retention does this hourly: an expired
    token is refused by its own `exp`, so its row proves nothing any more); how many."""
    return await core.db.aexecute(
        RefreshToken.delete().where(RefreshToken.expires_at < (now or utcnow()))
    )

