"""The audit log (SPEC §16): `audit_entry`, append-only, one hash chain per workspace
(`chain` is the workspace id; '' is the instance chain, whose entries answer
`workspace_id: null`), and `audit_chain`, one row per chain: its head (`seq`, `hash`),
locked by every writer of the chain in the transaction that writes an entry, so two
processes never give two entries one seq; and its base (`base_seq`, `base_hash`): the
last entry retention pruned, from which the chain is verified.

Frozen copies of the models as they are at this migration.
"""

from peewee import BigIntegerField, CharField, DateTimeField, Model, TextField


class AuditEntry(Model):
    audit_id = CharField(primary_key=True, max_length=36)
    chain = CharField(max_length=36)
    seq = BigIntegerField()
    at = DateTimeField(index=True)
    actor = TextField()
    actor_id = CharField(max_length=36, null=True)
    actor_name = CharField(max_length=255, null=True)
    action = CharField(max_length=64)
    target = TextField()
    target_id = CharField(max_length=255, null=True)
    request_id = CharField(max_length=128, null=True)
    client_ip = CharField(max_length=64, null=True)
    changes = TextField()
    prev_hash = CharField(max_length=64)
    hash = CharField(max_length=64)

    class Meta:
        table_name = "audit_entry"
        indexes = ((("chain", "seq"), True), (("action",), False), (("target_id",), False),
                   (("actor_id",), False))


class AuditChain(Model):
    chain = CharField(primary_key=True, max_length=36)
    seq = BigIntegerField(default=0)
    hash = CharField(max_length=64, default="")
    base_seq = BigIntegerField(default=0)
    base_hash = CharField(max_length=64, default="")

    class Meta:
        table_name = "audit_chain"


def up(migrator, db):
    models = [AuditEntry, AuditChain]
    with db.bind_ctx(models):
        db.create_tables(models)


def down(migrator, db):
    models = [AuditEntry, AuditChain]
    with db.bind_ctx(models):
        db.drop_tables(models)
