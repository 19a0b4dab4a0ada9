"""Workflow steps (SPEC §14) in one process, on both stores: a child run per step
instance (foreach items too), linked both ways, its output the step's; a child's
question answered on the child's trace and shown on the parent's; cancelling a parent
cancels every descendant; a deleted child template fails the waiting step."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestra.db.models import RunStep, WorkflowRun
from orchestra.services import auth, runs, templates
from orchestra.testing.fake_http import FakeHttp
from tests.engine.test_engine import events, kinds, wait_status


@pytest.fixture(scope="module")
def target():
    with FakeHttp() as server:
        yield server


@pytest.fixture
def settings_overrides(target):
    return {"step_egress_allow": f"127.0.0.1:{target.port}"}


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


async def template(core, owner: str, name: str, steps: list[dict], **options) -> str:
    made = await templates.create_template(core, owner_id=owner, is_admin=False, name=name, steps=steps,
                                    options=options or None)
    return made.id


async def run(core, owner: str, template_id: str, input="hello") -> str:
    started = await runs.start_run(core, user_id=owner, is_admin=False, template_id=template_id, input=input)
    return started.trace_id


async def children_of(core, trace_id: str) -> list[WorkflowRun]:
    return await core.db.list(WorkflowRun.select().where(WorkflowRun.parent_trace_id == trace_id)
                              .order_by(WorkflowRun.parent_path))


async def test_a_child_run_is_linked_both_ways_and_its_output_is_the_steps(core, target):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    child = await template(core, owner, "lookup", [{"id": "get", "http": {
        "method": "GET", "url": target.url + "/echo?q={{ input.company }}"}}],
        input_schema={"type": "object", "properties": {"company": {"type": "string"}}, "required": ["company"]},
        output="steps.get.output.body.query")
    parent = await template(core, owner, "research", [
        {"id": "find", "workflow": {"template": "lookup", "input": '{"company": input}'}},
        {"id": "each", "depends_on": ["find"], "foreach": {"items": "['a', 'b']"},
         "workflow": {"template": child, "input": '{"company": item}'}},
    ])
    trace_id = await run(core, owner, parent, input="acme")
    done = await wait_status(core, trace_id, "succeeded", "failed", timeout=20)
    assert done.status == "succeeded", done.error
    rows = {r.path: r for r in await core.db.list(RunStep.select().where(RunStep.run == trace_id))}
    assert rows["find"].output_value == {"q": "acme"}
    assert rows["each"].output_value == [{"q": "a"}, {"q": "b"}]
    kids = await children_of(core, trace_id)
    assert sorted(k.parent_path for k in kids) == ["each[0]", "each[1]", "find"]
    assert all(k.owner_id == owner and k.depth == 2 and k.status == "succeeded" for k in kids)
    assert {rows[k.parent_path].child_trace_id for k in kids} == {k.trace_id for k in kids}
    evs = await events(core, trace_id)
    started = [e.data for e in evs if e.kind == "child_started"]
    finished = [e.data for e in evs if e.kind == "child_finished"]
    assert sorted(d["path"] for d in started) == ["each[0]", "each[1]", "find"]
    assert {d["child_trace_id"] for d in finished} == {k.trace_id for k in kids}
    assert all(d["status"] == "succeeded" for d in finished)
    detail = await runs.run_detail(core, kids[0])
    assert detail["parent"] == {"trace_id": trace_id, "path": kids[0].parent_path}


async def test_a_childs_question_is_answered_on_the_childs_trace(core):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    await template(core, owner, "ask", [{"id": "q", "agent": {"human": True}, "prompt": "Approve {{input}}?"}])
    parent = await template(core, owner, "outer", [{"id": "sub", "workflow": {"template": "ask", "input": "input"}}])
    trace_id = await run(core, owner, parent, input="the plan")
    deadline = time.monotonic() + 10
    while True:
        asked = [e.data for e in await events(core, trace_id) if e.kind == "reply_requested"]
        if asked or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert len(asked) == 1 and asked[0]["prompt"] == "Approve the plan?", asked
    child = asked[0]["child_trace_id"]
    assert (await children_of(core, trace_id))[0].trace_id == child
    assert await runs.pending_replies(core, await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)) == []
    await runs.reply(core, user_id=owner, is_admin=False, trace_id=child, content="yes",
                   request_id=asked[0]["request_id"])
    done = await wait_status(core, trace_id, "succeeded", "failed", timeout=10)
    assert done.status == "succeeded" and (await runs.run_detail(core, done))["output"] == "yes"
    assert "reply_received" in kinds(await events(core, trace_id))


async def test_cancelling_a_parent_cancels_every_descendant(core):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    await template(core, owner, "leaf", [{"id": "q", "agent": {"human": True}, "prompt": "wait"}])
    await template(core, owner, "middle", [{"id": "m", "workflow": {"template": "leaf", "input": "input"}}])
    top = await template(core, owner, "top", [{"id": "t", "workflow": {"template": "middle", "input": "input"}}])
    trace_id = await run(core, owner, top)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        chain = await core.db.list(WorkflowRun.select().where(WorkflowRun.depth == 3))
        if chain and chain[0].status == "waiting_reply":
            break
        await asyncio.sleep(0.05)
    began = time.monotonic()
    await runs.cancel_run(core, user_id=owner, is_admin=False, trace_id=trace_id)
    while time.monotonic() - began < 2:
        statuses = [r.status for r in await core.db.list(WorkflowRun.select())]
        if statuses == ["cancelled"] * 3:
            break
        await asyncio.sleep(0.02)
    assert sorted(r.depth for r in await core.db.list(WorkflowRun.select())) == [1, 2, 3]
    assert statuses == ["cancelled"] * 3, statuses


async def test_a_deleted_child_template_fails_the_waiting_step(core):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    leaf = await template(core, owner, "leaf", [{"id": "q", "agent": {"human": True}, "prompt": "wait"}])
    top = await template(core, owner, "top", [{"id": "t", "workflow": {"template": "leaf", "input": "input"}}])
    trace_id = await run(core, owner, top)
    deadline = time.monotonic() + 10
    while not await children_of(core, trace_id) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await templates.delete_template(core, user_id=owner, is_admin=False, template_id=leaf)
    done = await wait_status(core, trace_id, "succeeded", "failed", timeout=10)
    assert done.status == "failed" and "was deleted" in done.error, done.error
    child = (await children_of(core, trace_id))[0]
    assert (await wait_status(core, child.trace_id, "cancelled", "failed")).status == "cancelled"


async def test_a_workflow_step_runs_the_version_it_names(core, target):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    leaf = await template(core, owner, "leaf", [{"id": "get", "http": {"method": "GET", "url": target.url + "/echo?v=1"}}],
                          output="steps.get.output.body.query.v")
    await templates.update_template(core, user_id=owner, is_admin=False, template_id=leaf, name="leaf", steps=[
        {"id": "get", "http": {"method": "GET", "url": target.url + "/echo?v=2"}}],
        options={"output": "steps.get.output.body.query.v"})
    parent = await template(core, owner, "top", [
        {"id": "old", "workflow": {"template": "leaf", "version": 1, "input": "input"}},
        {"id": "new", "workflow": {"template": "leaf", "input": "input"}}])
    trace_id = await run(core, owner, parent)
    done = await wait_status(core, trace_id, "succeeded", "failed", timeout=20)
    assert done.status == "succeeded", done.error
    rows = {r.path: r for r in await core.db.list(RunStep.select().where(RunStep.run == trace_id))}
    assert (rows["old"].output, rows["new"].output) == ("1", "2")
    assert sorted(k.template_version for k in await children_of(core, trace_id)) == [1, 2]
    with pytest.raises(Exception) as refused:
        await template(core, owner, "bad", [{"id": "x", "workflow": {"template": "leaf", "version": 9, "input": "input"}}])
    assert refused.value.detail[0]["field"] == "steps.0.workflow.version"


async def test_each_attempt_has_its_child_and_child_finished_comes_before_the_steps_end(core, target):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    await template(core, owner, "flaky", [{"id": "get", "http": {"method": "GET", "url": target.url + "/status/500"}}])
    parent = await template(core, owner, "top", [
        {"id": "call", "workflow": {"template": "flaky", "input": "input"},
         "retry": {"max_attempts": 2, "backoff_seconds": 0}, "on_error": "continue"}])
    trace_id = await run(core, owner, parent)
    done = await wait_status(core, trace_id, "succeeded", "failed", timeout=20)
    assert done.status == "succeeded", done.error
    kids = await children_of(core, trace_id)
    assert len(kids) == 2 and all(k.status == "failed" and k.attempts == 1 for k in kids)
    evs = [e for e in await events(core, trace_id) if e.data.get("step_id") == "call"]
    assert kinds(evs) == ["step_started", "child_started", "child_finished", "step_retrying",
                          "step_started", "child_started", "child_finished", "step_failed"]
    assert [e.data.get("attempt", 1) for e in evs if e.kind == "child_finished"] == [1, 2]
    assert {e.data["child_trace_id"] for e in evs if e.kind == "child_finished"} == {k.trace_id for k in kids}
    # nothing comes between a child_finished and its step's end (or retry): they are one write
    seqs = [e.seq for e in evs]
    assert seqs[3] == seqs[2] + 1 and seqs[7] == seqs[6] + 1
