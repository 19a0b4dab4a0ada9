"""The initial schema: users, tokens, the agent platform and workflow runs.

A frozen copy of the models as they were at this migration, deliberately
independent of orchestra.db.models so later model changes never alter it.
"""

import datetime as dt
import json
import uuid

from peewee import (
    BigIntegerField,
    BooleanField,
    CharField,
    DateTimeField,
    ForeignKeyField,
    IntegerField,
    Model,
    TextField,
)


def utcnow():
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def new_id():
    return str(uuid.uuid4())


class JSONField(TextField):

    def db_value(self, value):
        return None if value is None else json.dumps(value, separators=(",", ":"))

    def python_value(self, value):
        return None if value is None else json.loads(value)


class BaseModel(Model):
    class Meta:
        legacy_table_names = False


class User(BaseModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    user_name = CharField(max_length=64)
    user_name_key = CharField(max_length=256, unique=True)  # casefolded, for uniqueness
    password_hash = CharField(max_length=255)
    role = CharField(max_length=32, index=True)
    created_at = DateTimeField(default=utcnow, index=True)


class RefreshToken(BaseModel):

    jti = CharField(primary_key=True, max_length=64)
    family = CharField(max_length=64, index=True)
    user = ForeignKeyField(User, on_delete="CASCADE", index=True)
    used_at = DateTimeField(null=True)
    revoked = BooleanField(default=False)
    expires_at = DateTimeField()
    created_at = DateTimeField(default=utcnow)


class Provider(BaseModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=128, unique=True)
    kind = CharField(max_length=32)
    model_id = CharField(max_length=256)
    base_url = CharField(max_length=1024, null=True)
    api_key_encrypted = TextField(null=True)
    api_key_hint = CharField(max_length=32, null=True)  # masked form: sk-…abcd
    created_by = ForeignKeyField(User, null=True, on_delete="SET NULL")
    created_at = DateTimeField(default=utcnow)


class Skill(BaseModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=128, unique=True)
    description = TextField(default="")
    instructions = TextField(default="")
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)


class Worker(BaseModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    name = CharField(max_length=128)
    description = TextField(default="")
    system_prompt = TextField(default="")
    provider = ForeignKeyField(Provider, on_delete="RESTRICT", index=True)
    model = CharField(max_length=256, null=True)
    tools = JSONField(default=list)
    bound_skill = CharField(max_length=128, null=True, index=True)
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)


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


class WorkflowTemplate(BaseModel):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    name = CharField(max_length=128)
    description = TextField(default="")
    steps = JSONField()
    shared = BooleanField(default=False)
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)


class WorkflowRun(BaseModel):
    trace_id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    template = ForeignKeyField(WorkflowTemplate, null=True, on_delete="SET NULL")
    template_name = CharField(max_length=128)
    steps = JSONField()  # the template's steps as they were when the run started
    input = TextField(default="")
    files = JSONField(default=list)
    status = CharField(max_length=32, index=True)
    error = TextField(null=True)
    created_at = DateTimeField(default=utcnow, index=True)
    started_at = DateTimeField(null=True)
    finished_at = DateTimeField(null=True)


class RunStep(BaseModel):
    run = ForeignKeyField(WorkflowRun, on_delete="CASCADE", backref="step_rows")
    step_id = CharField(max_length=128)
    status = CharField(max_length=32)
    output = TextField(null=True)
    error = TextField(null=True)
    usage = JSONField(null=True)
    started_at = DateTimeField(null=True)
    finished_at = DateTimeField(null=True)

    class Meta:
        indexes = ((("run", "step_id"), True),)


class RunEvent(BaseModel):

    run = ForeignKeyField(WorkflowRun, on_delete="CASCADE")
    seq = IntegerField()
    kind = CharField(max_length=32)
    data = JSONField()
    created_at = DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("run", "seq"), True),)


MODELS = [
    User, RefreshToken, Provider, Skill, Worker, SystemNode, Upload,
    WorkflowTemplate, WorkflowRun, RunStep, RunEvent,
]


def up(migrator, db):
    with db.bind_ctx(MODELS):
        db.create_tables(MODELS)


def down(migrator, db):
    with db.bind_ctx(MODELS):
        db.drop_tables(list(reversed(MODELS)))
