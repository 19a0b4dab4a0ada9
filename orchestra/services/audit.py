"""The audit log (SPEC §16): who changed what, one entry per change, written in the
transaction of the change.

`record(core, action=..., target=..., changes=...)` is the one way an entry is written.
It must run inside the transaction that makes the change (it opens one of its own only
for what changes nothing, a failed login), so a change never lacks its entry and a
change rolled back leaves none. Entries form one hash chain per workspace (`chain`, the
workspace id; `INSTANCE_CHAIN` for instance-level entries): each entry's `seq` is its
chain's previous plus one and its `prev_hash` the previous `hash`. The writer takes its
chain's head row (`audit_chain`) with an UPDATE first, which holds the row's lock until
the transaction ends on PostgreSQL (two processes never fork a chain; the unique
`(chain, seq)` backs it up) and is inside SQLite's one write lock.

Who acted comes from the request: the web layer binds an `Actor` and the client's
address for each request (`bind`); a hook or a schedule binds its own (`acting_as`);
without either the change came from the store's own command line (`via: "store"`).
`request_id` is the request's `X-Request-ID` (observability/context.py).

`verify` (orchestra audit verify) and `prune` (retention) are in services/audit_chain.py;
an entry of a workspace is also an `audit.<action>` event for the subscriptions that take
it, queued in the same transaction (services/audit_events.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from orchestra.db.audit_models import INSTANCE_CHAIN, AuditChain, AuditEntry
from orchestra.db.models import iso, storable, utcnow
from orchestra.errors import ValidationError
from orchestra.observability import context
from orchestra.services import audit_events
from orchestra.services.paging import DEFAULT_LIMIT, Page, keyset_page
from orchestra.services.roles import Role
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action, Caller, allows, member_workspaces, require

MASK = "***"  # a secret value or an API key, in `changes`
VIAS = ("token", "key", "hook", "schedule", "store")


@dataclass(frozen=True)
class Actor:
    """Who made a change: a user (by token or API key), a hook or a schedule acting for
    its owner, or the store's command line (no user)."""

    user_id: str | None
    user_name: str | None
    via: str = "token"
    key_id: str | None = None

    def view(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"user_id": self.user_id, "user_name": self.user_name, "via": self.via}
        if self.key_id is not None:
            shown["key_id"] = self.key_id
        return shown


STORE = Actor(None, None, via="store")

_actor: ContextVar[Actor | None] = ContextVar("orchestra_audit_actor", default=None)
_client_ip: ContextVar[str | None] = ContextVar("orchestra_audit_client_ip", default=None)


def bind(actor: Actor | None, client_ip: str | None = None) -> None:
    """The current request's caller and address (a request's task is reused by the next
    request of its connection: the web layer binds at every request's start)."""
    _actor.set(actor)
    _client_ip.set(client_ip)


def bind_actor(actor: Actor) -> None:
    """The caller, once the request is authenticated (its address stays)."""
    _actor.set(actor)


def current_actor() -> Actor:
    return _actor.get() or STORE


@contextmanager
def acting_as(actor: Actor) -> Iterator[None]:
    """Changes made inside are `actor`'s (a hook's or a schedule's start)."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


def workspace_of(resource: Any) -> str | None:
    """The workspace an entry about `resource` belongs to (its chain); None: the instance
    chain. Resources carry `workspace_id` once workspaces exist (SPEC §16)."""
    if isinstance(resource, dict):  # a row about to be inserted in bulk
        return resource.get("workspace_id")
    return getattr(resource, "workspace_id", None)


def target(kind: str, id: Any, name: Any = None) -> dict[str, Any]:
    return {"type": kind, "id": None if id is None else str(id), "name": name}


def change(before: Any, after: Any, *, secret: bool = False) -> dict[str, Any]:
    """One field's `{from, to}`; a secret's value (or a key) shows as "***" on the side
    that has one."""
    if secret:
        before = None if before is None else MASK
        after = None if after is None else MASK
    return {"from": before, "to": after}


def diff(before: Mapping[str, Any], after: Mapping[str, Any], *,
         secret_fields: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """`{field: {from, to}}` of the fields that differ (a field missing is null)."""
    changes = {}
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if name in secret_fields:
            if old is not None or new is not None:
                changes[name] = change(old, new, secret=True)
        elif old != new:
            changes[name] = change(old, new)
    return changes


def entry_hash(fields: Mapping[str, Any]) -> str:
    """SHA-256 of an entry's canonical JSON (sorted keys, no spaces), its own hash left
    out: what `verify` recomputes from the stored row."""
    body = {k: v for k, v in fields.items() if k != "hash"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def hashed_fields(row: AuditEntry) -> dict[str, Any]:
    """The fields of a stored entry that its hash covers."""
    return {
        "audit_id": row.audit_id, "workspace_id": row.chain or None, "seq": int(row.seq),
        "at": iso(_as_datetime(row.at)), "actor": row.actor, "action": row.action,
        "target": row.target, "request_id": row.request_id, "client_ip": row.client_ip,
        "changes": row.changes, "prev_hash": row.prev_hash,
    }


def _as_datetime(value: Any) -> dt.datetime:
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Pending:
    """An entry to write: what `record_many` takes."""

    action: str
    target: dict[str, Any]
    changes: dict[str, Any] | None = None
    workspace_id: str | None = None
    actor: Actor | None = None


async def record(
    core: Shared, *, action: str, target: dict[str, Any], changes: dict[str, Any] | None = None,
    workspace_id: str | None = None, actor: Actor | None = None,
) -> AuditEntry:
    """Append one entry to its chain, inside the caller's transaction (the change's).
    Called last in that transaction, so the chain's head is held only while it commits."""
    entries = await record_many(core, [Pending(action, target, changes, workspace_id, actor)])
    return entries[0]


async def record_many(core: Shared, pending: list[Pending]) -> list[AuditEntry]:
    """Append entries (a minute's schedule fires) in a few statements per chain, inside
    the caller's transaction; outside one, in a transaction of their own."""
    if not pending:
        return []
    if not core.db.in_transaction():
        async with core.write_transaction():
            return await record_many(core, pending)
    now = utcnow()
    at = now.replace(microsecond=now.microsecond // 1000 * 1000)  # what `iso` shows, exactly
    written: list[AuditEntry] = []
    chains: dict[str, list[Pending]] = {}
    for item in pending:
        chains.setdefault(item.workspace_id or INSTANCE_CHAIN, []).append(item)
    for chain in sorted(chains):  # one order of chain locks in every writer
        items = chains[chain]
        # who takes these as `audit.*` events: read before the chain's head is held
        listeners = await audit_events.listeners(core, chain) if chain != INSTANCE_CHAIN else []
        last, prev_hash = await _take(core, chain, len(items))
        entries = []
        for seq, item in enumerate(items, start=last - len(items) + 1):
            who = item.actor or current_actor()
            entry = AuditEntry(
                audit_id=str(uuid.uuid4()), chain=chain, seq=seq, at=at, actor=who.view(),
                actor_id=who.user_id, actor_name=who.user_name, action=item.action, target=item.target,
                target_id=item.target.get("id"), request_id=context.request_id.get(),
                client_ip=_client_ip.get(), changes=item.changes or {}, prev_hash=prev_hash, hash="",
            )
            entry.hash = prev_hash = entry_hash(hashed_fields(entry))
            entries.append(entry)
        await core.db.aexecute(AuditEntry.insert_many([e.__data__ for e in entries]))
        await core.db.aexecute(AuditChain.update(hash=prev_hash).where(AuditChain.chain == chain))
        if listeners:
            await audit_events.queue(core, listeners, [view(e) for e in entries])
        written += entries
    return written


async def _take(core: Shared, chain: str, count: int) -> tuple[int, str]:
    """Move the chain's head `count` entries on: its new last seq and the hash before the
    first of them, the head row now held (locked) until the transaction ends."""
    bump = AuditChain.update(seq=AuditChain.seq + count).where(AuditChain.chain == chain)
    if not await core.db.aexecute(bump):  # the chain's first entry: make its head (one racer wins)
        await core.db.aexecute(AuditChain.insert(chain=chain, seq=0, hash="", base_seq=0, base_hash="")
                               .on_conflict_ignore())
        await core.db.aexecute(bump)
    # read through this core's store, in the transaction that holds the head
    head = await core.db.get(AuditChain.select().where(AuditChain.chain == chain).bind(core.db))
    return int(head.seq), head.hash


def view(entry: AuditEntry) -> dict[str, Any]:
    """An entry as the API shows it."""
    return {
        "audit_id": entry.audit_id, "seq": int(entry.seq), "at": iso(_as_datetime(entry.at)),
        "actor": entry.actor, "workspace_id": entry.chain or None, "action": entry.action,
        "target": entry.target, "request_id": entry.request_id, "client_ip": entry.client_ip,
        "changes": entry.changes, "prev_hash": entry.prev_hash, "hash": entry.hash,
    }


# --- reading -------------------------------------------------------------------------------

FILTERS = ("actor", "action", "target_id", "from", "to")


def parse_instant(name: str, text: str) -> dt.datetime:
    """A `from`/`to` bound: a date (its midnight, UTC) or an ISO 8601 date-time (no
    zone: UTC); 422 naming the field otherwise."""
    value = text.strip()
    try:
        if len(value) == 10:
            return dt.datetime.combine(dt.date.fromisoformat(value), dt.time())
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        if moment.tzinfo is not None:
            moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    except (ValueError, OverflowError):
        raise ValidationError.field(name, "must be a date (2026-12-01) or a date-time "
                                          "(2026-12-01T09:30:00Z)") from None
    return moment


async def readable_chains(core: Shared, caller: Caller, workspace_id: str | None) -> list[str] | None:
    """The chains the caller reads (SPEC §16); None: every one. A SUPER_ADMINISTRATOR
    reads every chain (the instance's included), or the one named (a deleted workspace's
    too); anyone else a workspace they are `admin` or `owner` of (404 for one they are not
    a member of, 403 naming `admin` below it), or, unfiltered, those of every workspace
    where they are — never the instance chain."""
    if Role(caller.role) == Role.SUPER_ADMINISTRATOR:
        if workspace_id is None:
            return None
        known = len(workspace_id) <= 36 and storable(workspace_id) and await core.db.exists(
            AuditChain.select().where(AuditChain.chain == workspace_id).bind(core.db))
        if not known:  # no chain: a workspace that never had an entry, or none at all
            await require(core, caller, workspace_id, Action.MANAGE)  # 404 for no workspace
        return [workspace_id]
    if workspace_id is not None:
        found = await require(core, caller, workspace_id, Action.MANAGE)
        return [found.workspace.id]
    roles = await member_workspaces(core, caller.user_id)
    return sorted(w for w, role in roles.items() if allows(role, Action.MANAGE))


async def list_entries(
    core: Shared, *, actor: str | None = None, action: str | None = None,
    target_id: str | None = None, since: dt.datetime | None = None,
    until: dt.datetime | None = None, limit: int = DEFAULT_LIMIT, cursor: str | None = None,
    chains: list[str] | None = None,
) -> Page[AuditEntry]:
    """A page of entries, newest first; `chains`: only these chains (None: every one)."""
    query = AuditEntry.select()
    if chains is not None:
        query = query.where(AuditEntry.chain.in_(chains))
    if actor:
        query = query.where((AuditEntry.actor_id == actor) | (AuditEntry.actor_name == actor))
    if action:
        query = query.where(AuditEntry.action == action)
    if target_id:
        query = query.where(AuditEntry.target_id == target_id)
    if since is not None:
        query = query.where(AuditEntry.at >= since)
    if until is not None:
        query = query.where(AuditEntry.at < until)
    return await keyset_page(core.db, query, kind="audit", at=AuditEntry.at, key=AuditEntry.audit_id,
                             limit=limit, cursor=cursor, newest_first=True)
