"""The in-process user copy on SQLite: one `PRAGMA data_version` probe serves one turn of
the event loop, and a commit made by another connection (another process, the CLI) is
seen by the first check after the loop turns."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from orchestra.errors import PermissionDeniedError
from orchestra.services import auth
from orchestra.services.roles import Role
from orchestra.services.user_snapshot import UserSnapshot

PASSWORD = "password-123"


def _store_path(settings) -> str:
    return settings.database_url.split("sqlite:///", 1)[1]


def _demote_elsewhere(path: str, user_id: str) -> None:
    """What another process does: a commit on a connection of its own."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE user SET role = 'USER' WHERE id = ?", (user_id,))
    conn.close()


async def test_a_demotion_committed_elsewhere_stops_the_next_check(core, settings):
    admin = await auth.register(core, user_name="root", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
    for _ in range(3):  # the copy is taken, then served
        await auth.confirm_role(core, user_id=admin.id, minimum=Role.SUPER_ADMINISTRATOR)
    _demote_elsewhere(_store_path(settings), admin.id)
    await asyncio.sleep(0)  # a request arriving after the commit runs in a later loop turn
    with pytest.raises(PermissionDeniedError):
        await auth.confirm_role(core, user_id=admin.id, minimum=Role.SUPER_ADMINISTRATOR)
    assert [u.role for u in await auth.list_users(core)] == ["USER"]


async def test_one_probe_serves_one_loop_turn_and_the_next_turn_probes_again(core, settings):
    admin = await auth.register(core, user_name="root", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
    path = _store_path(settings)
    snapshot = UserSnapshot(path)
    try:
        assert [u.id for u in await snapshot.users(core.db)] == [admin.id]
        await asyncio.sleep(0)
        copy = snapshot.current()
        assert copy is not None and copy.by_id[admin.id].role == "SUPER_ADMINISTRATOR"
        _demote_elsewhere(path, admin.id)
        # Same turn of the loop: the probe taken before the commit still answers; every
        # request served from it arrived before that probe was taken.
        assert snapshot.current() is copy
        await asyncio.sleep(0)
        assert snapshot.current() is None  # the next turn probes again and sees the commit
        assert [u.role for u in await snapshot.users(core.db)] == ["USER"]
    finally:
        snapshot.close()


async def test_a_write_made_here_is_seen_at_once(core):
    admin = await auth.register(core, user_name="root", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
    other = await auth.register(core, user_name="second", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
    await auth.confirm_role(core, user_id=other.id, minimum=Role.SUPER_ADMINISTRATOR)
    await auth.set_role(core, user_id=other.id, new_role=Role.USER)
    with pytest.raises(PermissionDeniedError):
        await auth.confirm_role(core, user_id=other.id, minimum=Role.SUPER_ADMINISTRATOR)
    assert (await auth.confirm_role(core, user_id=admin.id, minimum=Role.SUPER_ADMINISTRATOR)).id == admin.id
