"""Agent service rules and the agent cache the workflow engine reads, on both stores."""

from __future__ import annotations

import pytest

from orchestra.db.models import Worker
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.services import agents, auth
from orchestra.services import providers as psvc
from orchestra.services.agents import AgentConfig, agent_cache


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
async def owner(core):
    return await auth.register(core, user_name="owner", password="password-1")


@pytest.fixture
async def provider(core):
    return await psvc.create_provider(
        core, name="main", kind="deepseek", model_id="deepseek-chat", api_key="sk-secret-0000-9999"
    )


async def test_worker_config_carries_everything_the_engine_needs(core, owner, provider):
    await agents.create_skill(core, name="concise", instructions="Be brief.")
    worker = await agents.create_worker(
        core, owner_id=owner.id, name="writer", provider_id=provider.id, system_prompt="You write.",
        tools=["calculator", "calculator", "current_time"], bound_skill="CONCISE",
    )
    assert worker.tools == ["calculator", "current_time"] and worker.bound_skill == "concise"
    config = await agent_cache(core).worker(worker.id)
    assert config == AgentConfig(
        kind="worker", id=worker.id, owner_id=owner.id, name="writer", system_prompt="You write.",
        skill_instructions="Be brief.", tools=("calculator", "current_time"), provider_id=provider.id,
        provider_kind="deepseek", provider_base_url=None, provider_api_key="sk-secret-0000-9999",
        model="deepseek-chat", provider_name="main",
    )


async def test_node_configs(core, provider):
    cache = agent_cache(core)
    planner = await cache.node("planner")
    assert planner.kind == "node" and planner.tools == ("current_time",) and planner.provider_id is None
    assert planner.owner_id is None and planner.system_prompt
    await agents.update_node(core, name="planner", provider=provider.id, model="deepseek-reasoner")
    planner = await cache.node("planner")
    assert planner.provider_api_key == "sk-secret-0000-9999" and planner.model == "deepseek-reasoner"
    await agents.update_node(core, name="planner", model=None)
    assert (await cache.node("planner")).model == "deepseek-chat"
    assert await cache.node("janitor") is None


async def test_every_write_invalidates(core, owner, provider):
    cache = agent_cache(core)
    skill = await agents.create_skill(core, name="s", instructions="v1")
    worker = await agents.create_worker(core, owner_id=owner.id, name="w", provider_id=provider.id, bound_skill="s")
    assert (await cache.worker(worker.id)).skill_instructions == "v1"
    await agents.update_skill(core, skill_id=skill.id, instructions="v2")
    assert (await cache.worker(worker.id)).skill_instructions == "v2"
    await psvc.update_provider(core, provider_id=provider.id, api_key="sk-rotated-1111")
    assert (await cache.worker(worker.id)).provider_api_key == "sk-rotated-1111"
    await psvc.update_provider(core, provider_id=provider.id, model_id="deepseek-v3")
    assert (await cache.worker(worker.id)).model == "deepseek-v3"
    await agents.update_worker(core, owner_id=owner.id, worker_id=worker.id, model="pinned", bound_skill=None)
    config = await cache.worker(worker.id)
    assert config.model == "pinned" and config.skill_instructions is None
    await agents.delete_worker(core, owner_id=owner.id, worker_id=worker.id)
    assert await cache.worker(worker.id) is None


async def test_direct_store_changes_appear_after_reload(core, owner, provider):
    cache = agent_cache(core)
    worker = await agents.create_worker(core, owner_id=owner.id, name="w", provider_id=provider.id)
    assert (await cache.worker(worker.id)).name == "w"
    await core.db.aexecute(Worker.update(name="changed").where(Worker.id == worker.id))
    assert (await cache.worker(worker.id)).name == "w"  # cached
    assert await cache.reload() == {"workers": 1, "nodes": 3}
    assert (await cache.worker(worker.id)).name == "changed"


async def test_worker_created_elsewhere_is_found_on_a_miss(core, owner, provider):
    cache = agent_cache(core)
    await cache.reload()
    row = await Worker.acreate(owner=owner.id, name="external", provider=provider.id, tools=[])
    config = await cache.worker(row.id)
    assert config is not None and config.name == "external"
    assert await cache.worker("missing") is None


async def test_deleting_the_owner_invalidates(core, owner, provider):
    cache = agent_cache(core)
    worker = await agents.create_worker(core, owner_id=owner.id, name="w", provider_id=provider.id)
    assert await cache.worker(worker.id) is not None
    await auth.delete_user(core, user_id=owner.id)
    assert await cache.worker(worker.id) is None


async def test_one_cache_per_core(core):
    assert agent_cache(core) is agent_cache(core)
    assert core.extras["agent_cache"] is agent_cache(core)


async def test_worker_rules(core, owner, provider):
    other = await auth.register(core, user_name="other", password="password-1")
    worker = await agents.create_worker(core, owner_id=owner.id, name="w", provider_id=provider.id)
    with pytest.raises(NotFoundError):
        await agents.get_worker(core, owner_id=other.id, worker_id=worker.id)
    with pytest.raises(NotFoundError):
        await agents.delete_worker(core, owner_id=other.id, worker_id=worker.id)
    with pytest.raises(ValidationError) as info:
        await agents.update_worker(core, owner_id=owner.id, worker_id=worker.id, tools=["x"], bound_skill="y")
    assert {d["field"] for d in info.value.detail} == {"tools.0", "bound_skill"}
    with pytest.raises(ValidationError):
        await agents.update_worker(core, owner_id=owner.id, worker_id=worker.id, owner="x")
    assert [w.id for w in (await agents.list_workers(core, owner_id=owner.id)).rows] == [worker.id]
    assert (await agents.list_workers(core, owner_id=other.id)).rows == []


async def test_skill_rules(core, owner, provider):
    skill = await agents.create_skill(core, name="s")
    await agents.create_worker(core, owner_id=owner.id, name="w", provider_id=provider.id, bound_skill="s")
    with pytest.raises(ConflictError) as info:
        await agents.delete_skill(core, skill_id=skill.id)
    assert info.value.detail["workers"][0]["name"] == "w"
    with pytest.raises(ConflictError):
        await agents.create_skill(core, name="S")
    with pytest.raises(NotFoundError):
        await agents.get_skill(core, "nope")


async def test_node_rules(core):
    with pytest.raises(NotFoundError):
        await agents.update_node(core, name="janitor", model="m")
    with pytest.raises(ValidationError):
        await agents.update_node(core, name="planner")
    with pytest.raises(ValidationError):
        await agents.update_node(core, name="planner", provider="nope")
    nodes = await agents.list_nodes(core)
    assert [n["name"] for n in nodes] == list(agents.NODE_SPECS)
    for spec in agents.NODE_SPECS.values():  # fixed tools exist in the registry
        assert all(t in agents.tool_registry(core) for t in spec.tools)


async def test_nul_characters_are_422_or_not_found_never_a_store_error(core, owner, provider):
    """PostgreSQL refuses NUL in text; every entry point answers before the store sees it."""
    nul = "a\x00b"
    with pytest.raises(NotFoundError):
        await psvc.get_provider(core, nul)
    with pytest.raises(NotFoundError):
        await psvc.find_provider(core, nul)
    with pytest.raises(NotFoundError):
        await agents.get_skill(core, nul)
    with pytest.raises(NotFoundError):
        await agents.get_worker(core, owner_id=owner.id, worker_id=nul)
    assert await agent_cache(core).worker(nul) is None
    for kwargs in ({"description": nul}, {"instructions": nul}, {"name": nul}):
        with pytest.raises(ValidationError):
            await agents.create_skill(core, **{"name": "s", **kwargs})
    with pytest.raises(ValidationError) as info:
        await agents.create_worker(core, owner_id=owner.id, name="w", provider_id=nul, bound_skill=nul)
    assert {d["field"] for d in info.value.detail} == {"provider_id", "bound_skill"}
    for kwargs in ({"system_prompt": nul}, {"model": nul}):
        with pytest.raises(ValidationError):
            await agents.create_worker(core, owner_id=owner.id, name="w", provider_id=provider.id, **kwargs)
    with pytest.raises(ValidationError):
        await agents.update_node(core, name="planner", provider=nul)
    for kwargs in ({"model_id": nul}, {"api_key": nul}, {"base_url": "http://h/" + nul}):
        with pytest.raises(ValidationError):
            await psvc.create_provider(core, **{"name": "p2", "kind": "openai", "model_id": "m", **kwargs})


async def test_concurrent_writes_wait_their_turn(core, provider):
    """Read-then-write transactions must not fail with 'database is locked' on SQLite."""
    import asyncio

    skills = [await agents.create_skill(core, name=f"s{i}") for i in range(10)]
    results = await asyncio.gather(
        *[agents.update_node(core, name="planner", model=f"m{i}") for i in range(10)],
        *[agents.update_skill(core, skill_id=s.id, name=f"renamed{i}") for i, s in enumerate(skills)],
        *[agents.delete_skill(core, skill_id=s.id) for s in skills[:5]],
        return_exceptions=True,
    )
    unexpected = [r for r in results if isinstance(r, Exception) and not isinstance(r, NotFoundError)]
    assert unexpected == []
    assert (await agents.get_node(core, "planner"))["model"].startswith("m")
    assert len(await agents.list_skills(core)) == 5
