"""Secrets (SPEC §14, §15b): values HTTP steps send, kept encrypted, never returned, sent
only to the hosts they were entered for.

Administrators store a secret by name with its `hosts` (orchestra/secret_hosts.py);
templates name it as `{{ secrets.NAME }}` in an HTTP step's URL and header values only
(the template checks are in language/validate.py and `save_refusals` below). A
secret stored before hosts existed has none and goes nowhere until an administrator
sets them. A value is stored as SecretBox
ciphertext (Fernet, the key derived from the server secret, as provider keys are) plus
a hint (`…abcd`, the last four characters of a value of 8 or more, else `…`); no route
returns it. A run reads the values its step names when the step runs, and the values
join this process's redaction set (orchestra/redaction.py).

Teams (SPEC §16): a secret stored with a `workspace_id` is that workspace's, managed by
its admins (`workspace_rights.require(…, Action.MANAGE)`: 404 for a non-member, 403
below `admin`), its audit entries in the workspace's chain; one stored without is
instance-wide, managed by ADMINISTRATOR and above as before. Names are unique per
workspace and among instance-wide secrets. A run (and a save or a check in a workspace)
sees its workspace's secrets and the instance-wide ones, its workspace's first where
both have a name; another workspace's secret reads as one that does not exist.
"""

from __future__ import annotations

import re
from typing import Any

from peewee import IntegrityError

from orchestra import redaction, secret_hosts
from orchestra.db.models import Secret, iso, storable, utcnow
from orchestra.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from orchestra.services import audit, workspace_rights
from orchestra.services.roles import Role
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action, Caller

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
NAME_RULE = "must be 1 to 64 letters, digits or '_', not starting with a digit"
VALUE_MAX = 8192
# Printable ASCII, space and tab: what an HTTP header value or a URL may carry as it is.
VALUE = re.compile(rf"^[\t\x20-\x7e]{{{redaction.MIN_LENGTH},{VALUE_MAX}}}$")
VALUE_RULE = (f"must be {redaction.MIN_LENGTH} to {VALUE_MAX} printable ASCII characters "
              "(spaces and tabs allowed; no line breaks)")
HINT_FROM = 8  # a shorter value shows no character of itself


def hint(value: str) -> str:
    return "…" + value[-4:] if len(value) >= HINT_FROM else "…"


def clean_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValidationError.field("name", NAME_RULE)
    return name


def clean_value(value: str) -> str:
    if not isinstance(value, str) or not VALUE.fullmatch(value):
        raise ValidationError.field("value", VALUE_RULE)
    return value


def clean_hosts(hosts: Any) -> list[str]:
    try:
        return secret_hosts.clean_hosts(hosts)
    except ValueError as exc:
        raise ValidationError.field("hosts", str(exc)) from None


def secret_view(secret: Secret) -> dict[str, Any]:
    """What a client sees of a secret: never its value. `hosts` is null for a secret
    stored before hosts existed (no step may send it until they are set)."""
    return {
        "name": secret.name,
        "workspace_id": secret.workspace_id,
        "hint": secret.hint,
        "hosts": secret.hosts,
        "created_at": iso(secret.created_at),
        "updated_at": iso(secret.updated_at),
    }


async def scope_of(core: Shared, caller: Caller, workspace_id: str | None) -> str | None:
    """Where a caller manages secrets: `workspace_id`'s (404 for a non-member, 403 naming
    `admin` below it), else the instance-wide ones (ADMINISTRATOR and above, 403 else)."""
    if workspace_id is None:
        if Role(caller.role).rank < Role.ADMINISTRATOR.rank:
            raise PermissionDeniedError(f"This operation needs the role {Role.ADMINISTRATOR.value} or above "
                                        "(or admin in the workspace named by workspace_id).")
        return None
    found = await workspace_rights.require(core, caller, workspace_id, Action.MANAGE)
    return found.workspace.id


def _in(workspace_id: str | None) -> Any:
    return Secret.workspace_id.is_null() if workspace_id is None else Secret.workspace_id == workspace_id


async def create_secret(core: Shared, *, name: str, value: str, hosts: list[str],
                        created_by: str | None = None, workspace_id: str | None = None) -> Secret:
    """Store a new secret (in `workspace_id`, else instance-wide; the caller's right is
    `scope_of`'s); 422 for a bad name, value or hosts, 409 for a name in use there."""
    name, value, hosts = clean_name(name), clean_value(value), clean_hosts(hosts)
    secret = Secret(name=name, value_encrypted=core.secrets.encrypt(value), hint=hint(value),
                    hosts=hosts, created_by=created_by, workspace_id=workspace_id)
    if await Secret.aget_or_none((Secret.name == name) & _in(workspace_id)) is not None:
        raise _taken(name, workspace_id)
    try:
        async with core.write_transaction():
            await secret.asave(force_insert=True)
            await audit.record(core, action="secret.create", target=audit.target("secret", secret.id, name),
                               changes={"value": audit.change(None, value, secret=True),
                                        "hosts": audit.change(None, hosts)},
                               workspace_id=audit.workspace_of(secret))
    except IntegrityError:  # a concurrent create took the name
        raise _taken(name, workspace_id) from None
    redaction.remember([value])
    return secret


async def update_secret(core: Shared, *, name: str, value: str | None = None,
                        hosts: list[str] | None = None, workspace_id: str | None = None) -> Secret:
    """Replace a secret's value, its hosts, or both (`workspace_id`'s secret, else the
    instance-wide one); 404 for an unknown name."""
    if value is None and hosts is None:
        raise ValidationError("Send the secret's new value, its hosts, or both.", detail=[
            {"field": "value", "problem": "value or hosts is required"}])
    secret = await get_secret(name, workspace_id)
    changed = [Secret.updated_at]
    changes = {}
    if value is not None:
        value = clean_value(value)
        secret.value_encrypted, secret.hint = core.secrets.encrypt(value), hint(value)
        changed += [Secret.value_encrypted, Secret.hint]
        changes["value"] = audit.change(value, value, secret=True)
    if hosts is not None:
        before, secret.hosts = secret.hosts, clean_hosts(hosts)
        changed.append(Secret.hosts)
        changes["hosts"] = audit.change(before, secret.hosts)
    secret.updated_at = utcnow()
    async with core.write_transaction():
        if not await secret.asave(only=changed):
            raise NotFoundError(f"No secret is named '{name}'.")  # deleted meanwhile
        await audit.record(core, action="secret.update", target=audit.target("secret", secret.id, secret.name),
                           changes=changes, workspace_id=audit.workspace_of(secret))
    if value is not None:
        redaction.remember([value])
    return secret


async def list_secrets(core: Shared, workspace_id: str | None = None) -> list[Secret]:
    """`workspace_id`'s secrets, else the instance-wide ones, by name."""
    return await core.db.list(Secret.select().where(_in(workspace_id)).order_by(Secret.name))


async def get_secret(name: str, workspace_id: str | None = None) -> Secret:
    secret = None
    if storable(name) and NAME.fullmatch(name):
        secret = await Secret.aget_or_none((Secret.name == name) & _in(workspace_id))
    if secret is None:
        raise NotFoundError(f"No secret is named '{name}'" + (" in this workspace." if workspace_id else "."))
    return secret


async def delete_secret(core: Shared, *, name: str, workspace_id: str | None = None) -> None:
    """Delete a secret (`workspace_id`'s, else the instance-wide one); a template that
    names it fails that step when it runs (or uses the instance-wide one of that name)."""
    secret = await get_secret(name, workspace_id)
    async with core.write_transaction():
        if await core.db.aexecute(Secret.delete().where(Secret.id == secret.id)):
            await audit.record(core, action="secret.delete", target=audit.target("secret", secret.id, secret.name),
                               changes={"value": audit.change(secret.value_encrypted, None, secret=True),
                                        "hosts": audit.change(secret.hosts, None)},
                               workspace_id=audit.workspace_of(secret))


async def save_refusals(core: Shared, uses: list[tuple[str, str, str]],
                        workspace_id: str | None = None) -> list[tuple[str, str]]:
    """(field, problem) of each `{{ secrets.NAME }}` (field, name, the step's URL template)
    that a save in `workspace_id` refuses: where the URL writes its host literally, a secret that does not
    exist (another workspace's included) and one whose hosts do not list that host get the same sentence (no answer
    tells which names exist). Where the host comes from an expression nothing is
    refused here, exists or not: the run checks at every connection. The workspace's
    secret of a name is the one checked, else the instance-wide one."""
    literal = [(field, name, found) for field, name, url in uses
               if (found := secret_hosts.literal_destination(url)) is not None]
    if not literal:
        return []
    reach = Secret.workspace_id.is_null()
    if workspace_id is not None:
        reach = reach | (Secret.workspace_id == workspace_id)
    rows = await core.db.list(Secret.select(Secret.name, Secret.hosts, Secret.workspace_id)
                              .where(Secret.name.in_(sorted({name for _f, name, _d in literal})) & reach))
    hosts: dict[str, Any] = {}
    for row in sorted(rows, key=lambda r: r.workspace_id is not None):  # the workspace's last: it wins
        hosts[row.name] = row.hosts
    return [(field, secret_hosts.refusal(name, *where)) for field, name, where in literal
            if not secret_hosts.allows(hosts.get(name), *where)]


def _taken(name: str, workspace_id: str | None = None) -> ConflictError:
    where = f"?workspace_id={workspace_id}" if workspace_id else ""
    return ConflictError(f"A secret named '{name}' exists already; change its value with "
                         f"PUT /api/v1/resource/secret/{name}{where}.")
