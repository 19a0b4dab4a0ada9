"""The audit log's chains, store-side (SPEC §16): `verify` (orchestra audit verify) and
`prune` (retention, `ORCHESTRA_AUDIT_RETENTION_DAYS`).

A chain is verified from its base (`audit_chain.base_seq`/`base_hash`: the last entry
retention removed, 0 and "" before any was): each entry must hash to its `hash`, carry
the previous entry's hash as its `prev_hash` and the previous seq plus one, and the last
must be the head the chain's row names. Rows are read as stored (raw SQL): an entry
whose JSON was edited into something unreadable is reported like any other edit.

Retention removes whole prefixes: per chain, every entry up to the newest one older than
the cut-off, in batches, each batch moving the chain's base to its last removed entry in
the same transaction, so the chain stays verifiable from its new first entry.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from orchestra.db.audit_models import AuditChain, AuditEntry
from orchestra.db.database import release_connection
from orchestra.db.models import utcnow
from orchestra.services.audit import entry_hash
from orchestra.services.shared import Shared

READ_BATCH = 1000
PRUNE_BATCH = 1000
COLUMNS = ("audit_id", "chain", "seq", "at", "actor", "action", "target", "request_id",
           "client_ip", "changes", "prev_hash", "hash")


@dataclass
class Verdict:
    entries: int = 0
    chains: int = 0
    problems: list[str] = field(default_factory=list)  # the first bad entry of each broken chain

    @property
    def intact(self) -> bool:
        return not self.problems


def _name(chain: str) -> str:
    return "the instance chain" if chain == "" else f"the chain of workspace {chain}"


def _at(value: Any) -> str:
    moment = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def _fields(row: tuple) -> dict[str, Any]:
    raw = dict(zip(COLUMNS, row, strict=True))
    return {
        "audit_id": raw["audit_id"], "workspace_id": raw["chain"] or None, "seq": int(raw["seq"]),
        "at": _at(raw["at"]), "actor": json.loads(raw["actor"]), "action": raw["action"],
        "target": json.loads(raw["target"]), "request_id": raw["request_id"],
        "client_ip": raw["client_ip"], "changes": json.loads(raw["changes"]),
        "prev_hash": raw["prev_hash"], "hash": raw["hash"],
    }


async def _rows(core: Shared, chain: str, after: int) -> list[tuple]:
    sql = (f"SELECT {', '.join(COLUMNS)} FROM audit_entry WHERE chain = %s AND seq > %s "
           f"ORDER BY seq LIMIT {READ_BATCH}")
    if not core.is_postgres:
        sql = sql.replace("%s", "?")
    return await core.db.run(lambda: core.db.execute_sql(sql, (chain, after)).fetchall())


async def _verify_chain(core: Shared, head: AuditChain) -> tuple[int, str | None]:
    """(entries read, the first problem or None)."""
    seq, prev, read = int(head.base_seq), head.base_hash, 0
    while True:
        rows = await _rows(core, head.chain, seq if read else -1)
        for row in rows:
            read += 1
            audit_id, at_seq = row[0], int(row[2])
            if at_seq != seq + 1:
                if at_seq <= int(head.base_seq):
                    return read, (f"{_name(head.chain)}: entry {audit_id} (seq {at_seq}) lies before "
                                  f"the chain's first kept entry (seq {int(head.base_seq) + 1})")
                return read, (f"{_name(head.chain)}: entry seq {seq + 1} was removed "
                              f"(the next entry is {audit_id}, seq {at_seq})")
            try:
                fields = _fields(row)
            except (ValueError, TypeError):
                return read, f"{_name(head.chain)}: entry {audit_id} (seq {at_seq}) was edited (unreadable)"
            if entry_hash(fields) != fields["hash"]:
                return read, f"{_name(head.chain)}: entry {audit_id} (seq {at_seq}) was edited"
            if fields["prev_hash"] != prev:
                return read, (f"{_name(head.chain)}: entry {audit_id} (seq {at_seq}) does not follow "
                              f"the entry before it (reordered, or that entry was replaced)")
            seq, prev = at_seq, fields["hash"]
        if len(rows) < READ_BATCH:
            break
    if seq != int(head.seq) or prev != head.hash:
        return read, (f"{_name(head.chain)}: entries after seq {seq} were removed "
                      f"(the chain's head is seq {int(head.seq)})")
    return read, None


async def verify(core: Shared) -> Verdict:
    """Every chain checked from its base to its head."""
    verdict = Verdict()
    heads = {h.chain: h for h in await core.db.list(AuditChain.select().order_by(AuditChain.chain))}
    orphans = await core.db.list(AuditEntry.select(AuditEntry.chain).distinct()
                                 .where(AuditEntry.chain.not_in(list(heads) or [""])))
    for row in orphans:
        heads[row.chain] = AuditChain(chain=row.chain, seq=0, hash="", base_seq=0, base_hash="")
    for chain in sorted(heads):
        read, problem = await _verify_chain(core, heads[chain])
        verdict.entries += read
        verdict.chains += 1
        if problem:
            verdict.problems.append(problem)
    await release_connection(core.db)
    return verdict


async def _prune_batch(core: Shared, chain: str, cutoff: dt.datetime) -> int:
    """Remove up to PRUNE_BATCH of the chain's entries older than `cutoff`, oldest first,
    and move its base; how many."""
    async with core.write_transaction():
        head = await AuditChain.aget_or_none(AuditChain.chain == chain)
        if head is None:
            return 0
        base = int(head.base_seq)
        last = await core.db.list(
            AuditEntry.select(AuditEntry.seq, AuditEntry.hash)
            .where((AuditEntry.chain == chain) & (AuditEntry.seq > base) & (AuditEntry.at < cutoff)
                   & (AuditEntry.seq <= base + PRUNE_BATCH))
            .order_by(AuditEntry.seq.desc()).limit(1))
        if not last:
            return 0
        upto, upto_hash = int(last[0].seq), last[0].hash
        removed = await core.db.aexecute(AuditEntry.delete().where(
            (AuditEntry.chain == chain) & (AuditEntry.seq <= upto)))
        await core.db.aexecute(AuditChain.update(base_seq=upto, base_hash=upto_hash)
                               .where(AuditChain.chain == chain))
        return int(removed or 0)


async def prune(core: Shared, *, older_than: dt.timedelta, now: dt.datetime | None = None) -> int:
    """Remove every chain's entries older than `older_than` (whole prefixes); how many."""
    cutoff = (now or utcnow()) - older_than
    chains = [h.chain for h in await core.db.list(AuditChain.select(AuditChain.chain))]
    total = 0
    for chain in chains:
        while True:
            removed = await _prune_batch(core, chain, cutoff)
            await release_connection(core.db)
            total += removed
            if removed < PRUNE_BATCH:
                break
    return total
