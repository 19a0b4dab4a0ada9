"""A provider's `prices` override and `limits` (SPEC §12): stored exactly, shown with the
price that applies, 422 naming the field for what is negative or not a number."""

from __future__ import annotations

import pytest

from orchestra.db.models import Provider

URL = "/api/v1/provider"


def body(**overrides):
    return {"name": "main", "provider": "openai", "model_id": "gpt-4o-mini", **overrides}


async def test_database_price_is_shown_and_an_override_replaces_it(client, admin):
    response = await client.post(URL, json=body(), headers=admin["headers"])
    assert response.status_code == 201, response.text
    data = response.json()
    assert data["prices"] is None and data["limits"] is None
    assert data["price"] == {"input_per_mtok": "0.15", "output_per_mtok": "0.6",
                             "cached_input_per_mtok": "0.075", "source": "genai-prices"}
    changed = await client.put(f"{URL}/{data['provider_id']}", headers=admin["headers"], json={
        "prices": {"input_per_mtok": "0.1000", "output_per_mtok": 2.5},
        "limits": {"requests_per_minute": 60, "tokens_per_minute": 10000, "max_concurrency": 4}})
    assert changed.status_code == 200, changed.text
    view = changed.json()
    assert view["prices"] == {"input_per_mtok": "0.1", "output_per_mtok": "2.5"}
    assert view["price"] == {"input_per_mtok": "0.1", "output_per_mtok": "2.5",
                             "cached_input_per_mtok": "0.1", "source": "provider"}
    assert view["limits"] == {"requests_per_minute": 60, "tokens_per_minute": 10000, "max_concurrency": 4}
    row = await Provider.aget(Provider.id == data["provider_id"])
    assert row.prices == {"input_per_mtok": "0.1", "output_per_mtok": "2.5"}
    removed = await client.put(f"{URL}/{data['provider_id']}", headers=admin["headers"],
                               json={"prices": None, "limits": None})
    assert removed.json()["prices"] is None and removed.json()["price"]["source"] == "genai-prices"
    assert removed.json()["limits"] is None


async def test_an_unknown_model_has_no_price_never_zero(client, admin):
    response = await client.post(URL, headers=admin["headers"], json=body(
        provider="openai_compatible", model_id="fake-model", base_url="http://127.0.0.1:9/v1"))
    assert response.status_code == 201
    assert response.json()["price"] is None


@pytest.mark.parametrize(("field", "value", "named"), [
    ("prices", {"input_per_mtok": -1, "output_per_mtok": 1}, "prices.input_per_mtok"),
    ("prices", {"input_per_mtok": "1", "output_per_mtok": "cheap"}, "prices.output_per_mtok"),
    ("prices", {"input_per_mtok": 1, "output_per_mtok": 1, "cached_input_per_mtok": True},
     "prices.cached_input_per_mtok"),
    ("prices", {"input_per_mtok": "NaN", "output_per_mtok": 1}, "prices.input_per_mtok"),
    ("prices", {"input_per_mtok": 1}, "prices.output_per_mtok"),
    ("prices", {"input_per_mtok": 1, "output_per_mtok": 1, "extra": 1}, "prices.extra"),
    ("prices", "free", "prices"),
    ("limits", {"tokens_per_minute": -5}, "limits.tokens_per_minute"),
    ("limits", {"max_concurrency": "four"}, "limits.max_concurrency"),
    ("limits", {"requests_per_minute": 1.5}, "limits.requests_per_minute"),
])
async def test_bad_money_terms_are_422_naming_the_field(client, admin, field, value, named):
    response = await client.post(URL, json=body(**{field: value}), headers=admin["headers"])
    assert response.status_code == 422, response.text
    fields = {d["field"] for d in response.json()["detail"]}
    assert named in fields
    assert await client.app.ctx.core.db.count(Provider.select()) == 0
