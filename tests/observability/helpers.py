"""Reading a Prometheus scrape in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} of a scrape."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist yet (a counter never touched)."""
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(client, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text
