"""A parent waiting for its child run holds no run slot (SPEC §14): with
ORCHESTRA_MAX_RUNS 1 a chain of three runs still finishes in one process."""

from __future__ import annotations

import pytest

from orchestra.db.models import WorkflowRun
from orchestra.services import auth, runs, templates
from tests.engine.test_engine import wait_status


@pytest.fixture
def settings_overrides():
    return {"max_runs": 1}


async def test_a_chain_runs_with_one_run_slot(core):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id

    async def template(name, steps):
        return (await templates.create_template(core, owner_id=owner, is_admin=False, name=name, steps=steps)).id

    await template("leaf", [{"id": "q", "http": {"method": "GET", "url": "http://127.0.0.1:1/"}, "on_error": "continue"}])
    await template("middle", [{"id": "m", "workflow": {"template": "leaf", "input": "input"}}])
    top = await template("top", [{"id": "t", "workflow": {"template": "middle", "input": "input"}}])
    run = await runs.start_run(core, user_id=owner, is_admin=False, template_id=top, input="x")
    done = await wait_status(core, run.trace_id, "succeeded", "failed", timeout=20)
    assert done.status == "succeeded", done.error


async def test_children_past_the_room_wait_for_a_claim_and_run_once(core):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    await templates.create_template(core, owner_id=owner, is_admin=False, name="leaf", steps=[
        {"id": "q", "http": {"method": "GET", "url": "http://127.0.0.1:1/"}, "on_error": "continue"}])
    top = (await templates.create_template(core, owner_id=owner, is_admin=False, name="top", steps=[
        {"id": "each", "foreach": {"items": "['a', 'b', 'c']"}, "workflow": {"template": "leaf", "input": "item"}}])).id
    run = await runs.start_run(core, user_id=owner, is_admin=False, template_id=top, input="x")
    done = await wait_status(core, run.trace_id, "succeeded", "failed", timeout=20)
    assert done.status == "succeeded", done.error
    kids = await core.db.list(WorkflowRun.select().where(WorkflowRun.parent_trace_id == run.trace_id))
    # the first child is stored claimed and starts at once; the others queue for the one
    # slot: each is claimed once, never counted as a crashed attempt
    assert sorted(k.input for k in kids) == ["a", "b", "c"]
    assert [(k.status, k.attempts, k.owner_process) for k in kids] == [("succeeded", 1, None)] * 3
