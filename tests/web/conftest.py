"""Signed-in callers shared by the route tests of the agent platform."""

import pytest


@pytest.fixture
async def admin(users):
    """An ADMINISTRATOR, logged in (see tests/conftest.Users.make)."""
    return await users.make("admin", "ADMINISTRATOR")


@pytest.fixture
async def user(users):
    """A plain USER, logged in."""
    return await users.make("plainuser", "USER")


@pytest.fixture
async def alice(users):
    """A plain USER named alice, logged in."""
    return await users.make("alice")


@pytest.fixture
def make_worker(client, fake_llm):
    """`await make_worker(owner, tools)`: a provider on the fake model (made once) and a
    worker named `w` of `owner` using it; returns the worker's id."""
    from orchestra.services import agents, providers

    core = client.app.ctx.core
    made: dict[str, str] = {}

    async def make(owner: dict, tools: list[str]) -> str:
        if "provider" not in made:
            provider = await providers.create_provider(
                core, name="fake", kind="openai_compatible", model_id="fake-model", api_key="k",
                base_url=fake_llm.base_url)
            made["provider"] = provider.id
        worker = await agents.create_worker(core, owner_id=owner["user_id"], name="w",
                                            provider_id=made["provider"], tools=tools)
        return worker.id

    return make


#: The fake model's prices in the spend tests (USD per million tokens; SPEC §12).
PRICES = {"input_per_mtok": "1000", "output_per_mtok": "2000", "cached_input_per_mtok": "500"}


@pytest.fixture
async def priced(client, alice, fake_llm):
    """A provider on the fake model with PRICES, and alice's worker `w` on it:
    `{provider, worker}` ids."""
    from orchestra.services import agents, providers

    core = client.app.ctx.core
    provider = await providers.create_provider(
        core, name="fake", kind="openai_compatible", model_id="fake-model", api_key="k",
        base_url=fake_llm.base_url, prices=PRICES)
    worker = await agents.create_worker(core, owner_id=alice["user_id"], name="w",
                                        provider_id=provider.id, tools=[])
    return {"provider": provider.id, "worker": worker.id}
