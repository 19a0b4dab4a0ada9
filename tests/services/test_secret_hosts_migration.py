"""Migration 0017_secret_hosts (SPEC §15b): secrets stored before it keep their values,
get `hosts` NULL (no step may send them until an administrator sets their hosts), and
the upgrade says so in a warning naming them."""

from __future__ import annotations

import logging

import pytest
from playhouse.migrations import Runner

from orchestra.db import migrate
from orchestra.db.database import connect
from orchestra.db.models import Secret, utcnow
from orchestra.services import secrets as secret_service
from orchestra.services.crypto import SecretBox


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path) -> str:
    """A store with no tables yet: the test migrates it to just before 0017."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'blank.db'}"
    return request.getfixturevalue("blank_postgres_url")


async def test_secrets_stored_before_hosts_are_named_by_the_upgrade_and_unusable(database_url, caplog):
    db = connect(database_url)
    try:
        await db.run(lambda: Runner(db, directory=str(migrate.MIGRATIONS_DIR)).up("0016_reuse_keys"))
        box = SecretBox("test-secret-" + "x" * 32)
        marks = ", ".join([db.param] * 5)
        for name in ("OLD_TOKEN", "CRM_KEY"):
            await db.aexecute_sql(
                f"INSERT INTO secret (id, name, value_encrypted, hint, created_at, updated_at) VALUES ({marks}, {db.param})",
                (f"id-{name}", name, box.encrypt(f"value-of-{name}"), "…", utcnow(), utcnow()))
        with caplog.at_level(logging.WARNING, logger="orchestra.db.migrations"):
            assert "0017_secret_hosts" in await migrate.upgrade(db)
        warned = [r.getMessage() for r in caplog.records if r.name == "orchestra.db.migrations"]
        assert len(warned) == 1 and "2 secret(s)" in warned[0] and "CRM_KEY, OLD_TOKEN" in warned[0]
        assert "unusable" in warned[0] and "orchestra secret hosts" in warned[0]
        with db.bind_ctx([Secret]):
            rows = await db.list(Secret.select().order_by(Secret.name))
            assert [(r.name, r.hosts, box.decrypt(r.value_encrypted)) for r in rows] == [
                ("CRM_KEY", None, "value-of-CRM_KEY"), ("OLD_TOKEN", None, "value-of-OLD_TOKEN")]
            assert secret_service.secret_view(rows[0])["hosts"] is None
    finally:
        await db.close_pool()
