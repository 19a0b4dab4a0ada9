"""The audit log's tables (SPEC §16; migration 0020): entries and one head row per chain.
What they mean and how they are written is services/audit.py."""

from __future__ import annotations

from peewee import BigIntegerField, CharField, DateTimeField

from orchestra.db.models import BaseModel, JSONField

INSTANCE_CHAIN = ""  # the chain of instance-level entries (workspace_id null)


class AuditEntry(BaseModel):
    """One change, append-only: no route updates or deletes a row; retention removes a
    chain's oldest entries only, as a whole prefix (`AuditChain.base_seq` moves with it)."""

    audit_id = CharField(primary_key=True, max_length=36)
    chain = CharField(max_length=36)  # the workspace id, INSTANCE_CHAIN for none
    seq = BigIntegerField()
    at = DateTimeField(index=True)
    actor = JSONField()
    actor_id = CharField(max_length=36, null=True)  # copied out of `actor` for the filter
    actor_name = CharField(max_length=255, null=True)
    action = CharField(max_length=64)
    target = JSONField()
    target_id = CharField(max_length=255, null=True)
    request_id = CharField(max_length=128, null=True)
    client_ip = CharField(max_length=64, null=True)
    changes = JSONField()
    prev_hash = CharField(max_length=64)
    hash = CharField(max_length=64)

    class Meta:
        table_name = "audit_entry"


class AuditChain(BaseModel):
    """A chain's head (the last entry's `seq` and `hash`) and base (the last pruned one's)."""

    chain = CharField(primary_key=True, max_length=36)
    seq = BigIntegerField(default=0)
    hash = CharField(max_length=64, default="")
    base_seq = BigIntegerField(default=0)
    base_hash = CharField(max_length=64, default="")

    class Meta:
        table_name = "audit_chain"
