"""Peewee models of every stored thing. The schema itself is made by migrations/.

Times are naive UTC datetimes; ids are UUID strings except the append-only
event log, which uses an integer key and a per-run `seq`.
"""

from __future__ import annotations

import datetime as dt
import json
import unicodedata
import uuid

from peewee import (
    AutoField,
    BigIntegerField,
    BooleanField,
    CharField,
    DatabaseProxy,
    DateTimeField,
    DoubleField,
    ForeignKeyField,
    IntegerField,
    TextField,
)
from playhouse.pwasyncio import AsyncModel

database_proxy = DatabaseProxy()


def utcnow() -> dt.datetime:
    """The current UTC time as a naive datetime (what every time column stores)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def new_id() -> str:
    return str(uuid.uuid4())


def iso(value: dt.datetime | None) -> str | None:
    """A stored time as ISO 8601 UTC with a `Z`, for API bodies."""
    if value is None:
        return None
    if isinstance(value, str):  # SQLite may hand back text for a computed column
        value = dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def storable(value: str | None) -> bool:
    """False for text no store keeps (PostgreSQL refuses NUL characters): such an id is
    simply not found, and such a field is a 422, never a 500."""
    return value is None or "\x00" not in value


class JSONField(TextField):
    """JSON kept as text, so the same column works on SQLite and PostgreSQL."""

    def db_value(self, value):
        return None if value is None else json.dumps(value, separators=(",", ":"))

    def python_value(self, value):
        return None if value is None else json.loads(value)


def name_key(name: str) -> str:
    """The uniqueness key of a name compared without regard to case or width (NFKC,
    casefolded): "Same", "same" and "ＳＡＭＥ" are one name."""
    return unicodedata.normalize("NFKC", name).casefold()


class BaseModel(AsyncModel):
    class Meta:
        database = database_proxy
        legacy_table_names = False


class NamedModel(BaseModel):
    """A model whose `name` is unique without regard to case (in a scope its Meta
    index says): `name_key` always follows `name` on save, and a unique index on it
    (migration 0002) makes the store refuse a duplicate, so concurrent creates or
    renames cannot both win. Writes that bypass `save()` must set `name_key` too."""

    def save(self, force_insert: bool = False, only=None):
        self.name_key = name_key(self.name)
        if only is not None:
            only = [*only, type(self).name_key]
        return super().save(force_insert, only)


class User(BaseModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    user_name = CharField(max_length=64)
    user_name_key = CharField(max_length=256, unique=True)  # casefolded, for uniqueness
    password_hash = CharField(max_length=255)
    role = CharField(max_length=32, index=True)
    created_at = DateTimeField(default=utcnow, index=True)


class RefreshToken(BaseModel):
    """One issued refresh token; `family` ties a login to all of its rotations."""

    jti = CharField(primary_key=True, max_length=64)
    family = CharField(max_length=64, index=True)
    user = ForeignKeyField(User, on_delete="CASCADE", index=True)
    used_at = DateTimeField(null=True)
    revoked = BooleanField(default=False)
    # When the family's access tokens were stopped too (reuse detected, password changed);
    # null when only its refresh tokens were revoked (a role change) or never.
    access_revoked_at = DateTimeField(null=True, index=True)
    expires_at = DateTimeField(index=True)
    created_at = DateTimeField(default=utcnow)


class Provider(NamedModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=128)  # unique per workspace, and among instance-wide ones (migration 0025)
    name_key = CharField(max_length=512)  # the same
    kind = CharField(max_length=32)
    model_id = CharField(max_length=256)
    base_url = CharField(max_length=1024, null=True)
    api_key_encrypted = TextField(null=True)
    api_key_hint = CharField(max_length=32, null=True)  # masked form: sk-…abcd
    prices = JSONField(null=True)  # {input_per_mtok, output_per_mtok, cached_input_per_mtok}
    limits = JSONField(null=True)  # {requests_per_minute, tokens_per_minute, max_concurrency}
    created_by = ForeignKeyField(User, null=True, on_delete="SET NULL")
    created_at = DateTimeField(default=utcnow)
    # Its workspace (SPEC §16; deleted with it); None: instance-wide, usable by every workspace.
    workspace_id = CharField(max_length=36, null=True)


class Skill(NamedModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=128, unique=True)
    name_key = CharField(max_length=512, unique=True)
    description = TextField(default="")
    instructions = TextField(default="")
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)


class Worker(NamedModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    name = CharField(max_length=128)
    name_key = CharField(max_length=512)  # unique per owner
    description = TextField(default="")
    system_prompt = TextField(default="")
    provider = ForeignKeyField(Provider, on_delete="RESTRICT", index=True)
    model = CharField(max_length=256, null=True)
    tools = JSONField(default=list)
    bound_skill = CharField(max_length=128, null=True, index=True)
    workspace_id = CharField(max_length=36, null=True, index=True)  # SPEC §16
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("owner", "name_key"), True),)


class SystemNode(BaseModel):
    name = CharField(primary_key=True, max_length=64)
    provider = ForeignKeyField(Provider, null=True, on_delete="SET NULL")
    model = CharField(max_length=256, null=True)
    updated_at = DateTimeField(default=utcnow)


class Upload(BaseModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    filename = CharField(max_length=512)
    size = BigIntegerField()
    content_type = CharField(max_length=255)
    sha256 = CharField(max_length=64)
    created_at = DateTimeField(default=utcnow)


class WorkflowTemplate(NamedModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    name = CharField(max_length=128)
    name_key = CharField(max_length=512)  # unique per owner
    description = TextField(default="")
    steps = JSONField()
    spec = JSONField(null=True)  # input_schema, limits, output (SPEC §7)
    shared = BooleanField(default=False)
    workspace_id = CharField(max_length=36, null=True, index=True)  # SPEC §16 (db/workspace_models.py)
    version = IntegerField(default=0)  # the latest version's number (SPEC §13)
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("owner", "name_key"), True),)


class TemplateVersion(BaseModel):
    """One immutable save of a template (SPEC §13): its content, stored once, and its
    `step_count` (every step with an id, inner ones included) so a list reads no content."""

    id = AutoField()
    template = ForeignKeyField(WorkflowTemplate, on_delete="CASCADE", index=False)
    version = IntegerField()
    name = CharField(max_length=128)
    description = TextField(default="")
    steps = JSONField()
    spec = JSONField(null=True)
    step_count = IntegerField(default=0)
    author = ForeignKeyField(User, null=True, on_delete="SET NULL")
    created_at = DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("template", "version"), True),)


class WorkflowRun(BaseModel):
    trace_id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    template = ForeignKeyField(WorkflowTemplate, null=True, on_delete="SET NULL")
    template_name = CharField(max_length=128)
    steps = JSONField()  # the template's steps as they were when the run started
    spec = JSONField(null=True)  # the template's input_schema, limits and output then
    input = TextField(default="")
    input_value = JSONField(null=True)  # a JSON input (templates with input_schema)
    retry_of = CharField(max_length=36, null=True)  # the run whose succeeded steps this reuses
    template_version = IntegerField(null=True)  # the template version it runs (SPEC §13)
    # A fork's source: {trace_id, from_step, outputs: [ids whose outputs it set]}
    forked_from = JSONField(null=True)
    files = JSONField(default=list)
    status = CharField(max_length=32, index=True)
    error = TextField(null=True)
    created_at = DateTimeField(default=utcnow, index=True)
    started_at = DateTimeField(null=True)
    finished_at = DateTimeField(null=True, index=True)
    # Ownership (see engine/store/ownership.py): the process holding the run and until when
    # (epoch seconds), how many times it was claimed, and a cancel asked from anywhere.
    owner_process = CharField(max_length=128, null=True)
    lease_until = DoubleField(null=True)
    attempts = IntegerField(default=0)
    cancel_requested = BooleanField(default=False)
    # The W3C traceparent of the request that started the run: every attempt's spans join
    # that trace, in whichever process executes it (orchestra/observability/tracing.py).
    trace_parent = CharField(max_length=64, null=True)
    # Spend (SPEC §12), in whole pico-dollars: the budget (null: none) and what is spent,
    # reservations of calls in flight (or lost in a crash) included; null: nothing priced.
    budget_pusd = BigIntegerField(null=True)
    spent_pusd = BigIntegerField(null=True)
    # A child run (SPEC §14): the run and step instance that started it, and its level
    # in the chain (the top run is 1).
    parent_trace_id = CharField(max_length=36, null=True, index=True)
    parent_path = CharField(max_length=512, null=True)
    depth = IntegerField(default=1)
    # What started the run (SPEC §11): null for a person (or an API key), else
    # {kind: "webhook", hook_id, webhook_id} or {kind: "schedule", schedule_id, due_at}.
    trigger = JSONField(null=True)
    # The workspace the run belongs to: its template's (SPEC §16).
    workspace_id = CharField(max_length=36, null=True, index=True)


class RunStep(BaseModel):
    """One step instance of a run: `path` is its key in the run (`review`; under loops
    `research[3]`), `step_id` the template's id."""

    run = ForeignKeyField(WorkflowRun, on_delete="CASCADE", backref="step_rows")
    step_id = CharField(max_length=128)
    path = CharField(max_length=512, default="")
    status = CharField(max_length=32)
    attempt = IntegerField(default=1)
    reused = BooleanField(default=False)
    output = TextField(null=True)  # a text output (v1 steps)
    output_value = JSONField(null=True)  # a JSON output (steps with output_schema)
    error = TextField(null=True)
    usage = JSONField(null=True)
    cost_usd = TextField(null=True)  # exact decimal text; null: no priced call
    provider_id = CharField(max_length=36, null=True)  # the provider its model calls went to
    model = CharField(max_length=256, null=True)
    calls = IntegerField(default=0)  # model calls made, failed attempts included
    started_at = DateTimeField(null=True)
    finished_at = DateTimeField(null=True)
    child_trace_id = CharField(max_length=36, null=True)  # a workflow step's child run (SPEC §14)
    reuse_key = CharField(max_length=64, null=True)  # what an agent or human call ran with (engine/reuse.py)

    class Meta:
        indexes = ((("run", "path"), True), (("run", "step_id"), False))


class RunEvent(BaseModel):
    """The append-only event log of a run: stored before it is published."""

    run = ForeignKeyField(WorkflowRun, on_delete="CASCADE")
    seq = IntegerField()
    kind = CharField(max_length=32)
    data = JSONField()
    created_at = DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("run", "seq"), True),)


class McpServer(NamedModel):
    """An MCP server whose tools join the catalog (SPEC §9). Header and env values are
    secrets: stored only as one SecretBox ciphertext of the JSON object, plus masked
    hints (`…abcd`) for display. `tools` is what the last refresh listed."""

    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=64)  # unique per workspace, and among instance-wide ones (migration 0026)
    name_key = CharField(max_length=256)  # the same
    transport = CharField(max_length=32)  # streamable_http | stdio
    url = CharField(max_length=1024, null=True)
    command = CharField(max_length=1024, null=True)
    args = JSONField(default=list)
    headers_encrypted = TextField(null=True)
    headers_hint = JSONField(default=dict)
    env_encrypted = TextField(null=True)
    env_hint = JSONField(default=dict)
    timeout_seconds = DoubleField(default=30.0)
    tools = JSONField(default=list)  # [{name, description, parameters}]
    last_error = TextField(null=True)
    refreshed_at = DateTimeField(null=True)
    created_by = ForeignKeyField(User, null=True, on_delete="SET NULL")
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)
    # Its workspace (SPEC §16; deleted with it); None: instance-wide, its tools every workspace's.
    workspace_id = CharField(max_length=36, null=True)


class Secret(BaseModel):
    """A value HTTP steps may send (SPEC §14), to its `hosts` only (§15b): stored only as
    SecretBox ciphertext, plus a masked hint (`…abcd`) for lists; never returned."""

    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=64)  # unique per workspace, and among instance-wide ones (migration 0024)
    value_encrypted = TextField()
    hint = CharField(max_length=16)
    # Its workspace (SPEC §16; deleted with it); None: instance-wide, usable by every workspace.
    workspace_id = CharField(max_length=36, null=True)
    hosts = JSONField(null=True)  # where a step may send it (SPEC §15b); null: stored before hosts, unusable
    created_by = CharField(max_length=36, null=True)
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)
