"""Active runs in one tree of child runs are capped (SPEC §15b,
`ORCHESTRA_CHILD_TREE_MAX_ACTIVE`): a workflow step that would start one more fails,
naming the setting, and stores no child; cancelling the root ends the whole tree."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import RunEvent, WorkflowRun
from orchestra.services import auth, runs, templates
from tests.engine.test_engine import wait_status


@pytest.fixture
def settings_overrides():
    return {"child_tree_max_active": 3}


async def test_a_child_past_the_trees_cap_fails_its_step(core):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    await templates.create_template(core, owner_id=owner, is_admin=False, name="leaf", steps=[
        {"id": "q", "agent": {"human": True}, "prompt": "wait"}])
    top = (await templates.create_template(core, owner_id=owner, is_admin=False, name="top", steps=[
        {"id": "each", "foreach": {"items": "['a', 'b', 'c']", "max_concurrency": 3, "on_error": "continue"},
         "workflow": {"template": "leaf", "input": "item"}}])).id
    run = await runs.start_run(core, user_id=owner, is_admin=False, template_id=top, input="x")

    async def children() -> list[WorkflowRun]:
        return await core.db.list(WorkflowRun.select().where(WorkflowRun.parent_trace_id == run.trace_id))

    for _ in range(500):  # the top run and two children: the third is one too many
        kids = await children()
        if len(kids) == 2 and all(k.status == "waiting_reply" for k in kids):
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    assert [k.status for k in await children()] == ["waiting_reply"] * 2
    failed = await core.db.list(RunEvent.select().where(
        (RunEvent.run == run.trace_id) & (RunEvent.kind == "step_failed")))
    assert len(failed) == 1
    assert "ORCHESTRA_CHILD_TREE_MAX_ACTIVE (3)" in failed[0].data["error"], failed[0].data

    await core.engine.cancel(run.trace_id)  # the whole tree ends
    done = await wait_status(core, run.trace_id, "cancelled", timeout=10)
    assert done.status == "cancelled"
    for kid in await children():
        assert (await wait_status(core, kid.trace_id, "cancelled", timeout=10)).status == "cancelled"
