"""The store's record of provider calls under limits (migration 0014): one row per call
waiting, in flight or done in the last minute, shared by every process of a PostgreSQL
store (engine/provider_gate.py)."""

from __future__ import annotations

from peewee import CharField, DoubleField, IntegerField

from orchestra.db.models import BaseModel, new_id


class ProviderSlot(BaseModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    provider_id = CharField(max_length=36)
    run_id = CharField(max_length=36)
    tokens = IntegerField()
    state = CharField(max_length=16)  # waiting | held | done
    requested_at = DoubleField()
    granted_at = DoubleField(null=True)
    expires_at = DoubleField()
