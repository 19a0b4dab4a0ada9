"""Models of teams (SPEC §16): workspaces and their members. The schema is migration
0019; templates, runs, workers, schedules and hooks name theirs in `workspace_id`;
`workspace_month` (migration 0023) is a workspace's spend in a calendar month."""

from __future__ import annotations

from peewee import (
    BigIntegerField,
    BooleanField,
    CharField,
    CompositeKey,
    DateTimeField,
    ForeignKeyField,
)

from orchestra.db.models import BaseModel, JSONField, User, new_id, utcnow


class Workspace(BaseModel):
    """A team's workspace, or a user's personal one (`personal_user`: made with the
    user, deleted with the user, never shared). `limits`: `{monthly_budget_usd,
    on_budget}` or null; `monthly_budget_pusd` the same cap as a number."""

    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=128)
    personal = BooleanField(default=False)
    personal_user = ForeignKeyField(User, null=True, unique=True, on_delete="CASCADE")
    limits = JSONField(null=True)
    # `limits.monthly_budget_usd` in whole pico-dollars (rounded down), null: none —
    # written with `limits`, read by a reservation's one statement (migration 0023).
    monthly_budget_pusd = BigIntegerField(null=True)
    created_at = DateTimeField(default=utcnow)


class WorkspaceMember(BaseModel):
    """A user's role in a workspace (services/workspace_rights.py says what it allows)."""

    workspace = ForeignKeyField(Workspace, on_delete="CASCADE")
    user = ForeignKeyField(User, on_delete="CASCADE", index=True)
    role = CharField(max_length=16)
    created_at = DateTimeField(default=utcnow)

    class Meta:
        primary_key = CompositeKey("workspace", "user")


class WorkspaceMonth(BaseModel):
    """What a workspace's runs spent in one calendar month (UTC, `month` "YYYY-MM"), in
    whole pico-dollars, open reservations included: the running total its
    `limits.monthly_budget_usd` caps (engine/store/workspace_month.py). Kept while the
    workspace has a cap; a new month is a new row, from zero."""

    workspace = ForeignKeyField(Workspace, on_delete="CASCADE")
    month = CharField(max_length=7)
    spent_pusd = BigIntegerField(default=0)

    class Meta:
        table_name = "workspace_month"
        primary_key = CompositeKey("workspace", "month")
