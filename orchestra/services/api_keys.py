"""API keys (SPEC §11): a user's long-lived credential for machines, narrowed by scopes
and, for `run:start`, by a list of templates. A key belongs to a workspace and its user
(SPEC §16): made there by an admin of it (every user owns their personal one, the
default), it reaches that workspace only, with no more than its user's role there at the
moment of use (web/auth.py's `protected` reads that role for every request).

The secret is `orc_` + 32 random bytes (URL-safe base64), shown once at creation and
stored only as its SHA-256. A slow password hash (argon2) guards low-entropy secrets
people choose; 256 random bits cannot be guessed whatever the hash, and a key is
checked on every request, where argon2's ~50 ms and 64 MiB would cost more than the
request itself. Lookups go through each process's `KeyCache` (no store round trip while
nothing changed); `last_used_at` is written at most once a minute per key.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from peewee import JOIN

from orchestra.db.access_models import ApiKey
from orchestra.db.database import release_connection
from orchestra.db.models import User, iso, storable, utcnow
from orchestra.db.workspace_models import Workspace, WorkspaceMember
from orchestra.errors import NotFoundError, TokenInvalidError, ValidationError
from orchestra.services import audit, workspace_scope
from orchestra.services.key_cache import KeyEntry
from orchestra.services.personal_workspace import personal_workspace_id
from orchestra.services.providers import clean_name
from orchestra.services.roles import Role
from orchestra.services.run_access import require_runnable
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action, KeyReach, WorkspaceRole

logger = logging.getLogger("orchestra.keys")

PREFIX = "orc_"
SECRET_BYTES = 32
SCOPES = ("run:start", "run:read", "run:reply", "run:cancel", "template:read", "template:write")
NAME_MAX = 128
TEMPLATES_MAX = 100  # templates one key may be limited to
KEYS_MAX = 100  # active keys one user may hold
TOKEN_MAX = 256  # longer bearer values are not keys (nothing is hashed for them)
TOUCH_SECONDS = 60  # last_used_at is written at most this often per key


@dataclass(frozen=True, slots=True)
class KeyGrant:
    """What a request made with a key may do beyond its user's role."""

    key_id: str
    scopes: frozenset[str]
    templates: frozenset[str] | None  # run:start is limited to these; None: any the user may run
    workspace_id: str | None = None  # the one workspace it reaches (SPEC §16)
    personal: bool = False  # that workspace is its user's personal one

    def reach(self, user_id: str) -> KeyReach | None:
        if self.workspace_id is None:
            return None
        return KeyReach(self.workspace_id, user_id, self.personal)

    def allows_template(self, template_id: str | None) -> bool:
        return self.templates is None or template_id in self.templates


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def is_api_key(token: str) -> bool:
    return token.startswith(PREFIX)


# --- management -------------------------------------------------------------------------


def _name(name: str) -> str:
    """As every display name: NFKC, stripped, no control or format character (the rule
    the OpenAPI document publishes)."""
    return clean_name(name, max_length=NAME_MAX)


def _scopes(scopes: list[str]) -> list[str]:
    if not scopes:
        raise ValidationError.field("scopes", f"must name at least one of {', '.join(SCOPES)}")
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise ValidationError.field(
            "scopes", f"unknown scope '{str(unknown[0])[:64]}'; known: {', '.join(SCOPES)}")
    return [s for s in SCOPES if s in scopes]


_DATE_TIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?)?"
    r"([Zz]|[+-]\d{2}:?\d{2})?$")


def parse_expiry(value: str | None, *, now: dt.datetime | None = None) -> dt.datetime | None:
    """`expires_at` (ISO 8601 / RFC 3339; without an offset, UTC) as naive UTC; 422 unless
    a real time in the future. A leap second reads as :59, digits past microseconds are cut."""
    if value is None:
        return None
    match = _DATE_TIME.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValidationError.field("expires_at", "must be an ISO 8601 date and time")
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    try:
        when = dt.datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0),
                           min(int(second or 0), 59), int((fraction or "0")[:6].ljust(6, "0")))
        if offset and offset not in "Zz":
            sign = 1 if offset[0] == "+" else -1
            digits = offset[1:].replace(":", "")
            when -= sign * dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    except (ValueError, OverflowError):
        raise ValidationError.field("expires_at", "must be an ISO 8601 date and time") from None
    if when <= (now or utcnow()):
        raise ValidationError.field("expires_at", "must be in the future")
    return when


async def create_key(
    core: Shared, *, user_id: str, name: str, scopes: list[str],
    templates: list[str] | None = None, expires_at: str | None = None,
    workspace_id: str | None = None,
) -> tuple[ApiKey, str]:
    """Store a new key of `user_id` in `workspace_id` (default: the user's personal one;
    404 unless a member, 403 below `admin`); the row and the secret (returned this once).
    `templates` must be ones the user may run, of that workspace or shared (else 422)."""
    name, scopes = _name(name), _scopes(scopes)
    expiry = parse_expiry(expires_at)
    workspace_id = await workspace_scope.target(core, user_id, workspace_id, Action.MANAGE)
    if templates is not None:
        if len(templates) > TEMPLATES_MAX:
            raise ValidationError.field("templates", f"may list at most {TEMPLATES_MAX} templates")
        templates = list(dict.fromkeys(templates))
        await require_runnable(core, user_id=user_id, template_ids=templates, field="templates",
                               workspace_id=workspace_id)
    active = await core.db.count(
        ApiKey.select().where((ApiKey.user == user_id) & ApiKey.revoked_at.is_null()))
    if active >= KEYS_MAX:
        raise ValidationError.field("name", f"you have {KEYS_MAX} keys, the limit; revoke one first")
    secret = PREFIX + secrets.token_urlsafe(SECRET_BYTES)
    async with core.write_transaction():
        key = await ApiKey.acreate(
            user=user_id, name=name, key_hash=key_hash(secret), prefix=secret[len(PREFIX):][:8],
            scopes=scopes, templates=templates, expires_at=expiry, workspace_id=workspace_id,
        )
        await audit.record(core, action="key.create", target=audit.target("key", key.id, name),
                           changes={"key": audit.change(None, secret, secret=True),
                                    **audit.diff({}, {"name": name, "scopes": scopes, "templates": templates,
                                                      "expires_at": iso(expiry)})},
                           workspace_id=audit.workspace_of(key))
    core.key_cache.changed()
    return key, secret


def key_view(key: ApiKey) -> dict[str, Any]:
    """`key_info`: everything but the secret."""
    return {
        "key_id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "scopes": list(key.scopes or []),
        "templates": key.templates,
        "workspace_id": key.workspace_id,
        "created_at": iso(key.created_at),
        "last_used_at": iso(key.last_used_at),
        "expires_at": iso(key.expires_at),
    }


async def list_keys(core: Shared, *, user_id: str, workspace_id: str | None = None) -> list[ApiKey]:
    """The user's keys that are not revoked, oldest first; `workspace_id`: that
    workspace's only (404 unless the user is a member)."""
    where = (ApiKey.user == user_id) & ApiKey.revoked_at.is_null()
    if workspace_id is not None:
        workspace_id = await workspace_scope.target(core, user_id, workspace_id, Action.READ)
        where &= ApiKey.workspace_id == workspace_id
    return await core.db.list(ApiKey.select().where(where).order_by(ApiKey.created_at, ApiKey.id))


async def revoke_key(core: Shared, *, user_id: str, key_id: str) -> None:
    """Revoke one of the user's keys, at once on every process (the store's version
    changes; on PostgreSQL a trigger signals it); 404 for an unknown or revoked key."""
    revoked = 0
    if len(key_id) <= 36 and storable(key_id):
        async with core.write_transaction():
            now = utcnow()
            key = await ApiKey.aget_or_none((ApiKey.id == key_id) & (ApiKey.user == user_id))
            revoked = await core.db.aexecute(ApiKey.update(revoked_at=now).where(
                (ApiKey.id == key_id) & (ApiKey.user == user_id) & ApiKey.revoked_at.is_null()))
            if revoked and key is not None:
                await audit.record(core, action="key.revoke", target=audit.target("key", key.id, key.name),
                                   changes={"revoked_at": audit.change(None, iso(now))},
                                   workspace_id=audit.workspace_of(key))
    core.key_cache.changed()
    if not revoked:
        raise NotFoundError(f"No key of yours has the id '{key_id[:80]}'.")


# --- authentication -----------------------------------------------------------------------


async def authenticate(core: Shared, token: str) -> KeyEntry:
    """The stored key `token` names, if it may be used now; else 401 TokenInvalidError
    (unknown, revoked, expired, or its user deleted)."""
    if len(token) > TOKEN_MAX:
        raise TokenInvalidError("The API key is not known.")
    entry = await core.key_cache.lookup(core.db, key_hash(token))
    if entry is None:
        raise TokenInvalidError("The API key is not known (or its user was deleted).")
    if entry.revoked_at is not None:
        raise TokenInvalidError("The API key has been revoked.")
    now = utcnow()
    if entry.expires_at is not None and entry.expires_at <= now:
        raise TokenInvalidError("The API key has expired.")
    _touch(core, entry, now)
    return entry


@dataclass(frozen=True, slots=True)
class KeyWorkspace:
    """The key's workspace as one request sees it: its user's role there now, and the
    user's instance role as stored now."""

    workspace_id: str
    name: str
    personal: bool
    role: WorkspaceRole
    user_role: str


async def key_workspace(core: Shared, entry: KeyEntry) -> KeyWorkspace:
    """The key's workspace and its user's roles, read from the store now in one indexed
    round trip, with the key itself: the cache's copy is only a hint, so a key revoked or
    deleted, a user demoted or deleted, or a member removed on any process counts at the
    key's next use here (a PostgreSQL signal may still be on its way). 401
    `TokenInvalidError` for a key revoked or gone, a user who is no longer a member (a
    SUPER_ADMINISTRATOR is the owner of every workspace) or a workspace that is gone: such
    a key reaches nothing, and a client is told to stop using it."""
    workspace_id = entry.workspace_id or await personal_workspace_id(core, entry.user_id)
    rows = await core.db.list(
        ApiKey.select(ApiKey.revoked_at, User.role.alias("user_role"), Workspace.id.alias("workspace"),
                      Workspace.name, Workspace.personal, WorkspaceMember.role.alias("member_role"))
        .join(User, on=(ApiKey.user == User.id))
        .join(Workspace, JOIN.LEFT_OUTER, on=(Workspace.id == workspace_id))
        .join(WorkspaceMember, JOIN.LEFT_OUTER,
              on=((WorkspaceMember.workspace == Workspace.id) & (WorkspaceMember.user == entry.user_id)))
        .where(ApiKey.id == entry.key_id).dicts())
    if not rows:
        core.key_cache.changed()
        raise TokenInvalidError("The API key is not known (or its user was deleted).")
    row = rows[0]
    if row["revoked_at"] is not None:
        core.key_cache.changed()
        raise TokenInvalidError("The API key has been revoked.")
    if row["workspace"] is None:
        raise TokenInvalidError("The API key's workspace no longer exists.")
    if row["user_role"] == Role.SUPER_ADMINISTRATOR.value:
        role = WorkspaceRole.OWNER
    elif row["member_role"] is None:
        raise TokenInvalidError("The API key's user is no longer a member of the key's workspace.")
    else:
        role = WorkspaceRole(row["member_role"])
    return KeyWorkspace(workspace_id, row["name"], bool(row["personal"]), role, row["user_role"])


def grant_of(entry: KeyEntry, workspace: KeyWorkspace | None = None) -> KeyGrant:
    if workspace is None:
        return KeyGrant(entry.key_id, entry.scopes, entry.templates, entry.workspace_id)
    return KeyGrant(entry.key_id, entry.scopes, entry.templates, workspace.workspace_id,
                    workspace.personal)


def _touch(core: Shared, entry: KeyEntry, now: dt.datetime) -> None:
    """Record the key's use, at most once a minute per key: checked against this
    process's memory, and the write itself only moves a time older than a minute (so
    many processes still write about once a minute). Off the request's path."""
    touched = core.key_uses.touched
    window = dt.timedelta(seconds=TOUCH_SECONDS)
    last = max(filter(None, (touched.get(entry.key_id), entry.last_used_at)), default=None)
    if last is not None and now - last < window:
        return
    if len(touched) > 10_000:
        touched.clear()
    touched[entry.key_id] = now
    tasks = core.key_uses.tasks
    task = asyncio.get_running_loop().create_task(_write_use(core, entry.key_id, now, window))
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _write_use(core: Shared, key_id: str, now: dt.datetime, window: dt.timedelta) -> None:
    try:
        await core.db.aexecute(ApiKey.update(last_used_at=now).where(
            (ApiKey.id == key_id)
            & (ApiKey.last_used_at.is_null() | (ApiKey.last_used_at < now - window))))
    except Exception as exc:  # noqa: BLE001 - bookkeeping: a store outage only loses this write
        logger.debug("could not record an API key's use: %s", exc)
    finally:
        with contextlib.suppress(Exception):  # the pool may be closing at shutdown
            await release_connection(core.db)
