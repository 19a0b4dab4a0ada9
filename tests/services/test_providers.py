"""Provider service rules on both stores: validation, encryption at rest, conflicts, check."""

from __future__ import annotations

import pytest

from orchestra.db.models import Provider, User
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.services import agents, auth
from orchestra.services import providers as svc


@pytest.fixture
def database_url(both_stores):
    return both_stores


async def test_create_encrypts_and_masks(core):
    provider = await svc.create_provider(
        core, name="  Main  ", kind="openai", model_id="gpt-4o", api_key="sk-abcdefghijklmnop1234"
    )
    row = await Provider.aget(Provider.id == provider.id)
    assert row.name == "Main" and row.api_key_hint == "sk-…1234"
    assert "abcdefghijklmnop" not in row.api_key_encrypted
    assert svc.decrypt_api_key(core, row) == "sk-abcdefghijklmnop1234"
    view = svc.provider_view(row)
    assert view["api_key"] == "sk-…1234" and "sk-abcdefghijklmnop1234" not in str(view)


async def test_no_key_is_stored_as_null(core):
    provider = await svc.create_provider(core, name="local", kind="ollama", model_id="llama3", api_key="  ")
    assert provider.api_key_encrypted is None and provider.api_key_hint is None
    assert svc.provider_view(provider)["has_api_key"] is False


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "gemini"}, "provider"),
        ({"kind": "openai_compatible"}, "base_url"),
        ({"base_url": "javascript:alert(1)"}, "base_url"),
        ({"base_url": "http://"}, "base_url"),
        ({"name": "a\x00b"}, "name"),
        ({"model_id": "   "}, "model_id"),
    ],
)
async def test_validation(core, kwargs, field):
    args = {"name": "p", "kind": "openai", "model_id": "m", **kwargs}
    with pytest.raises(ValidationError) as info:
        await svc.create_provider(core, **args)
    assert info.value.detail[0]["field"] == field
    assert await core.db.count(Provider.select()) == 0


async def test_duplicate_name_case_insensitive(core):
    await svc.create_provider(core, name="Main", kind="openai", model_id="m")
    with pytest.raises(ConflictError):
        await svc.create_provider(core, name="main", kind="deepseek", model_id="m")


async def test_find_by_name_or_id(core):
    provider = await svc.create_provider(core, name="Main", kind="openai", model_id="m")
    assert (await svc.find_provider(core, "main")).id == provider.id
    assert (await svc.find_provider(core, provider.id)).name == "Main"
    with pytest.raises(NotFoundError):
        await svc.find_provider(core, "other")


async def test_delete_blocked_by_worker_then_allowed(core):
    user = await auth.register(core, user_name="owner", password="password-1")
    provider = await svc.create_provider(core, name="p", kind="openai", model_id="m")
    worker = await agents.create_worker(core, owner_id=user.id, name="w", provider_id=provider.id)
    with pytest.raises(ConflictError) as info:
        await svc.delete_provider(core, provider_id=provider.id)
    assert info.value.detail["workers"] == [{"worker_id": worker.id, "name": "w"}]
    await agents.delete_worker(core, owner_id=user.id, worker_id=worker.id)
    await svc.delete_provider(core, provider_id=provider.id)
    assert await core.db.count(Provider.select()) == 0
    assert await core.db.count(User.select()) == 1


async def test_update_keeps_kind_rules(core):
    provider = await svc.create_provider(
        core, name="c", kind="openai_compatible", model_id="m", base_url="http://127.0.0.1:1/v1/"
    )
    assert provider.base_url == "http://127.0.0.1:1/v1"
    with pytest.raises(ValidationError):
        await svc.update_provider(core, provider_id=provider.id, base_url=None)
    other = await svc.create_provider(core, name="d", kind="openai", model_id="m")
    with pytest.raises(ConflictError):
        await svc.update_provider(core, provider_id=other.id, name="C")


async def test_check_against_fake_llm(core, fake_llm):
    good = await svc.create_provider(
        core, name="good", kind="openai_compatible", model_id="fake-model", base_url=fake_llm.base_url, api_key="k-1"
    )
    assert await svc.check_provider(core, provider_id=good.id) == {"ok": True, "models": sorted(fake_llm.models)}
    bad = await svc.create_provider(
        core, name="bad", kind="openai_compatible", model_id="fake-model", base_url=fake_llm.base_url, api_key="bad-key"
    )
    answer = await svc.check_provider(core, provider_id=bad.id)
    # a sentence of ours, never the provider's body ("Incorrect API key provided")
    assert answer == {"ok": False, "error": "Provider 'bad' refused the API key (HTTP 401); check the key."}


async def test_check_with_undecryptable_key_is_not_ok(core):
    provider = await svc.create_provider(core, name="p", kind="openai", model_id="m", api_key="sk-123456789")
    await core.db.aexecute(Provider.update(api_key_encrypted="garbage").where(Provider.id == provider.id))
    answer = await svc.check_provider(core, provider_id=provider.id)
    assert answer["ok"] is False and "cannot be decrypted" in answer["error"]
