"""Two processes writing audit entries at once on one PostgreSQL store keep one chain
(SPEC §16): every seq from 1 up, once each, each prev_hash the hash before it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from orchestra.core import Core
from orchestra.db.audit_models import AuditChain, AuditEntry
from orchestra.services import audit, audit_chain
from tests.conftest import make_settings

PER_PROCESS = 60
TASKS = 4  # writers in each process, each its own transaction and connection

CHILD = textwrap.dedent(f"""
    import asyncio, sys
    from orchestra.core import Core
    from orchestra.services import audit
    from orchestra.settings import Settings

    async def main(tag):
        core = await Core.open(Settings.from_env())
        try:
            async def writer(n):
                for i in range({PER_PROCESS // TASKS}):
                    async with core.write_transaction():
                        await audit.record(core, action="template.update",
                                           target=audit.target("template", f"{{tag}}-{{n}}-{{i}}", "t"),
                                           changes={{"i": audit.change(None, i)}})
            await asyncio.gather(*(writer(n) for n in range({TASKS})))
        finally:
            await core.close()

    asyncio.run(main(sys.argv[1]))
""")


def test_two_processes_keep_one_chain(postgres_url, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "ORCHESTRA_HOME": str(home), "ORCHESTRA_DATABASE_URL": postgres_url,
           "ORCHESTRA_SECRET_KEY": "audit-secret-" + "p" * 32}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, tag], env=env, stderr=subprocess.PIPE, text=True)
                for tag in ("a", "b")]
    for child in children:
        _, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr

    async def check():
        core = await Core.open(make_settings(home, postgres_url, secret_key=env["ORCHESTRA_SECRET_KEY"]))
        try:
            rows = await core.db.list(AuditEntry.select().order_by(AuditEntry.seq))
            head = await AuditChain.aget(AuditChain.chain == "")
            return rows, head, await audit_chain.verify(core)
        finally:
            await core.close()

    rows, head, verdict = asyncio.run(check())
    assert [int(r.seq) for r in rows] == list(range(1, 2 * PER_PROCESS + 1))
    assert {r.target_id.split("-")[0] for r in rows} == {"a", "b"}
    for before, after in zip(rows, rows[1:], strict=False):
        assert after.prev_hash == before.hash
        assert after.hash == audit.entry_hash(audit.hashed_fields(after))
    assert rows[0].prev_hash == "" and (int(head.seq), head.hash) == (len(rows), rows[-1].hash)
    assert verdict.intact and verdict.entries == len(rows), verdict.problems
