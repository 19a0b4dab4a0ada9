"""Waiting parents share one look at whether their child's template still exists
(engine/child_step.py `TemplateCheck`): a tree of hundreds of waiting parents costs one
store query per template per period, not one per parent."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.engine import child_step
from orchestra.engine.child_step import TemplateCheck
from orchestra.services import auth, templates


async def leaf_template(core) -> tuple[str, str]:
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    leaf = await templates.create_template(core, owner_id=owner, is_admin=False, name="leaf", steps=[
        {"id": "q", "agent": {"human": True}, "prompt": "wait"}])
    return owner, leaf.id


def counted_check(core, looks: list[str], gate: asyncio.Event | None = None) -> TemplateCheck:
    """A TemplateCheck on the engine's own store query, counting the looks it makes."""
    steps = core.engine.child_steps

    async def exists(template_id: str) -> bool:
        looks.append(template_id)
        if gate is not None:
            await gate.wait()
        return await steps.children.template_exists(template_id)

    return TemplateCheck(exists, steps.store.release)


async def test_three_hundred_waiting_parents_cost_one_look(core):
    owner, leaf = await leaf_template(core)
    looks: list[str] = []
    check = counted_check(core, looks)
    answers = await asyncio.gather(*(check.exists(leaf) for _ in range(300)))
    assert answers == [True] * 300
    assert looks == [leaf]
    assert await check.exists(leaf) is True  # within the period: the same answer
    assert looks == [leaf]
    assert await check.exists("no-such-template") is False
    assert looks == [leaf, "no-such-template"]


async def test_a_deleted_template_is_seen_by_the_next_periods_look(core, monkeypatch):
    owner, leaf = await leaf_template(core)
    looks: list[str] = []
    check = counted_check(core, looks)
    assert await check.exists(leaf) is True
    await templates.delete_template(core, user_id=owner, is_admin=False, template_id=leaf)
    assert await check.exists(leaf) is True  # the period's answer still stands
    monkeypatch.setattr(child_step, "TEMPLATE_CHECK_SECONDS", 0.0)  # the period is over
    assert await check.exists(leaf) is False
    assert looks == [leaf, leaf]


async def test_a_cancelled_waiter_leaves_the_look_to_the_others(core):
    _owner, leaf = await leaf_template(core)
    looks: list[str] = []
    gate = asyncio.Event()
    check = counted_check(core, looks, gate)
    first = asyncio.create_task(check.exists(leaf))
    second = asyncio.create_task(check.exists(leaf))
    await asyncio.sleep(0.05)
    first.cancel()
    gate.set()
    assert await second is True
    assert first.cancelled()
    assert looks == [leaf]


async def test_a_look_that_failed_or_was_cancelled_is_asked_again(core):
    _owner, leaf = await leaf_template(core)
    looks: list[str] = []
    gate = asyncio.Event()
    check = counted_check(core, looks, gate)
    waiter = asyncio.create_task(check.exists(leaf))
    await asyncio.sleep(0.05)
    check._asked[leaf][1].cancel()  # as when the process stops mid-look
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.set()
    assert await check.exists(leaf) is True  # a new look, not the cancelled one's error
    assert looks == [leaf, leaf]
