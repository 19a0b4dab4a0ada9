"""Template validation and access rules of the workflows service."""

from __future__ import annotations

import pytest

from orchestra.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from orchestra.services import agents, auth, providers, runs, templates


@pytest.fixture
async def world(core):
    alice = await auth.register(core, user_name="alice", password="password-123")
    bob = await auth.register(core, user_name="bob", password="password-123")
    provider = await providers.create_provider(
        core, name="p", kind="openai_compatible", model_id="m", api_key="k", base_url="http://127.0.0.1:9/v1"
    )
    w_alice = await agents.create_worker(core, owner_id=alice.id, name="wa", provider_id=provider.id)
    w_bob = await agents.create_worker(core, owner_id=bob.id, name="wb", provider_id=provider.id)
    return {"alice": alice.id, "bob": bob.id, "wa": w_alice.id, "wb": w_bob.id}


def step(sid, agent, prompt="do {{input}}", depends_on=()):
    return {"id": sid, "agent": agent, "prompt": prompt, "depends_on": list(depends_on)}


async def problems_of(core, owner, steps) -> list[dict]:
    with pytest.raises(ValidationError) as caught:
        await templates.validate_steps(core, owner_id=owner, steps=steps)
    assert caught.value.status == 422
    return caught.value.detail


async def test_valid_steps_are_normalised(core, world):
    steps = await templates.validate_steps(core, owner_id=world["alice"], steps=[
        step("a", {"worker": world["wa"]}),
        step("b", {"node": "reviewer"}, "check {{steps.a.output}}", ["a", "a"]),
        step("c", {"human": True}, "ok? {{ steps.a.output }} {{steps.b.output}}", ["b"]),
    ])
    assert steps[1]["depends_on"] == ["a"]  # duplicates dropped
    assert [s["id"] for s in steps] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "bad, field, words",
    [
        ([step("a", {"human": True}), step("a", {"human": True})], "steps.1.id", "duplicate step id 'a'"),
        ([step("a", {"human": True}, depends_on=["zzz"])], "steps.0.depends_on", "unknown step 'zzz'"),
        ([step("a", {"human": True}, depends_on=["a"])], "steps.0.depends_on", "depends on itself"),
        ([step("a", {"human": True}, depends_on=["b"]), step("b", {"human": True}, depends_on=["a"])],
         "steps", "cycle"),
        ([step("a", {"node": "wizard"})], "steps.0.agent.node", "unknown system node"),
        ([step("a", {"human": False})], "steps.0.agent", "human"),
        ([step("a", {"worker": "x", "node": "planner"})], "steps.0.agent", "worker"),
        ([step("a", {"human": True}, "{{foo}}")], "steps.0.prompt", "unknown placeholder {{foo}}"),
        ([step("a", {"human": True}, "{{steps.q.output}}")], "steps.0.prompt", "unknown step 'q'"),
        ([step("a", {"human": True}), step("b", {"human": True}, "{{steps.a.output}}")],
         "steps.1.prompt", "needs step 'a' in depends_on"),
        ([step("a", {"human": True}, "  ")], "steps.0.prompt", "non-empty"),
        ([step("bad id!", {"human": True})], "steps.0.id", "letters"),
        ([{"id": "a", "agent": {"human": True}, "prompt": "p", "extra": 1}], "steps.0.extra", "not a step field"),
        (["nope"], "steps.0", "object"),
    ],
)
async def test_invalid_steps_name_the_problem(core, world, bad, field, words):
    detail = await problems_of(core, world["alice"], bad)
    assert any(d["field"] == field and words in d["problem"] for d in detail), detail


async def test_unknown_and_foreign_workers_are_refused(core, world):
    detail = await problems_of(core, world["alice"], [step("a", {"worker": world["wb"]})])
    assert detail[0]["field"] == "steps.0.agent.worker" and "unknown worker" in detail[0]["problem"]
    detail = await problems_of(core, world["alice"], [step("a", {"worker": "missing"})])
    assert "unknown worker" in detail[0]["problem"]


async def test_empty_or_huge_step_lists_are_refused(core, world):
    for steps in ([], [step(f"s{i}", {"human": True}) for i in range(51)]):
        with pytest.raises(ValidationError):
            await templates.validate_steps(core, owner_id=world["alice"], steps=steps)


async def test_every_problem_is_reported_in_one_422(core, world):
    """A duplicate id does not hide a cycle, nor a cycle an unknown placeholder (docs/api.md)."""
    detail = await problems_of(core, world["alice"], [
        step("a", {"human": True}, depends_on=["b"]),
        step("b", {"human": True}, "{{steps.a.output}} {{colour}}", depends_on=["a"]),
        step("a", {"node": "wizard"}, depends_on=["ghost"]),
        step("c", {"human": True}, "{{steps.d.output}}"),
    ])
    found = {(d["field"], d["problem"]) for d in detail}
    assert ("steps.2.id", "duplicate step id 'a'") in found
    assert ("steps.2.agent.node", "unknown system node 'wizard'; nodes: planner, reviewer, summarizer") in found
    assert ("steps.2.depends_on", "unknown step 'ghost'") in found
    assert ("steps", "the steps form a cycle: a -> b -> a") in found
    assert any(f == "steps.1.prompt" and "unknown placeholder {{colour}}" in p for f, p in found)
    assert ("steps.3.prompt", "{{steps.d.output}} names unknown step 'd'") in found
    assert len(detail) == 6, detail


async def test_cycle_message_names_the_path(core, world):
    detail = await problems_of(core, world["alice"], [
        step("a", {"human": True}, depends_on=["c"]),
        step("b", {"human": True}, depends_on=["a"]),
        step("c", {"human": True}, depends_on=["b"]),
    ])
    assert "a -> c -> b -> a" in detail[0]["problem"]


async def test_sharing_and_visibility(core, world):
    admin = await auth.register(core, user_name="root", password="password-123")
    human = [step("a", {"human": True})]
    with pytest.raises(PermissionDeniedError):
        await templates.create_template(core, owner_id=world["alice"], is_admin=False, name="s", steps=human, shared=True)
    shared = await templates.create_template(core, owner_id=admin.id, is_admin=True, name="s", steps=human, shared=True)
    private = await templates.create_template(core, owner_id=world["alice"], is_admin=False, name="p", steps=human)
    bob = {"user_id": world["bob"], "is_admin": False}
    assert (await templates.get_template(core, template_id=shared.id, **bob)).id == shared.id
    with pytest.raises(NotFoundError):
        await templates.get_template(core, template_id=private.id, **bob)
    with pytest.raises(PermissionDeniedError):
        await templates.delete_template(core, template_id=shared.id, **bob)
    listed = {t.id for t in (await templates.list_templates(core, user_id=world["bob"])).rows}
    assert listed == {shared.id}
    with pytest.raises(ConflictError):
        await templates.create_template(core, owner_id=world["alice"], is_admin=False, name="P", steps=human)
    with pytest.raises(PermissionDeniedError):
        await templates.update_template(core, user_id=world["alice"], is_admin=False, template_id=private.id,
                                 name="p", steps=human, shared=True)
    updated = await templates.update_template(core, user_id=world["alice"], is_admin=False,
                                       template_id=private.id, name="p2", steps=human * 1)
    assert updated.name == "p2"
    await templates.delete_template(core, user_id=world["alice"], is_admin=False, template_id=private.id)
    with pytest.raises(NotFoundError):
        await templates.get_template(core, user_id=world["alice"], is_admin=False, template_id=private.id)


async def test_runs_are_private_to_owner_and_admins(core, world):
    template = await templates.create_template(
        core, owner_id=world["alice"], is_admin=False, name="t", steps=[step("a", {"human": True})]
    )
    run = await runs.start_run(core, user_id=world["alice"], is_admin=False, template_id=template.id)
    with pytest.raises(NotFoundError):
        await runs.get_run(core, user_id=world["bob"], is_admin=False, trace_id=run.trace_id)
    with pytest.raises(NotFoundError):
        await runs.reply(core, user_id=world["bob"], is_admin=False, trace_id=run.trace_id, content="x")
    assert (await runs.get_run(core, user_id=world["bob"], is_admin=True, trace_id=run.trace_id)).trace_id
    with pytest.raises(NotFoundError):  # bob cannot run alice's private template
        await runs.start_run(core, user_id=world["bob"], is_admin=False, template_id=template.id)
    with pytest.raises(ValidationError):
        await runs.start_run(core, user_id=world["alice"], is_admin=False, template_id=template.id,
                           files=["not-an-upload"])
    with pytest.raises(PermissionDeniedError):
        await runs.list_runs(core, user_id=world["bob"], is_admin=False, all_users=True)
    assert [r.trace_id for r in (await runs.list_runs(core, user_id=world["alice"], is_admin=False)).rows] == [run.trace_id]
    await runs.cancel_run(core, user_id=world["alice"], is_admin=False, trace_id=run.trace_id)
