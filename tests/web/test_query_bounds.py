"""Query values the document allows are answered on both stores (schemathesis found a 500
on PostgreSQL for an `after` past the 32-bit seq column), and yes/no flags are strict."""

from __future__ import annotations

import pytest

from tests.web.test_workflow_routes import API, human, make_template, wait_for


@pytest.fixture
def database_url(both_stores: str) -> str:
    return both_stores



async def finished_run(client, who) -> str:
    template_id = (await make_template(client, who, [human()]))["template_id"]
    trace_id = (await client.post(f"{API}/run", headers=who["headers"], json={"template_id": template_id})).json()["trace_id"]
    await wait_for(client, who, trace_id, "waiting_reply")
    assert (await client.post(f"{API}/cancel/{trace_id}", headers=who["headers"])).status_code == 200
    await wait_for(client, who, trace_id, "cancelled")
    return trace_id


async def test_a_cursor_past_every_seq_means_nothing_after_it(client, alice):
    trace_id = await finished_run(client, alice)
    for after in ("91146150443051", str(2**31), "999999999999999999"):
        events = await client.get(f"{API}/run/{trace_id}/events?after={after}", headers=alice["headers"])
        assert events.status_code == 200, events.text
        assert events.json()["events"] == []
        stream = await client.get(f"{API}/sse/{trace_id}", headers={**alice["headers"], "Last-Event-ID": after})
        assert stream.status_code == 204, stream.text  # past the terminal event: nothing more will come
    every = await client.get(f"{API}/run/{trace_id}/events?after=0", headers=alice["headers"])
    assert every.json()["events"][-1]["kind"] == "run_cancelled"


@pytest.mark.parametrize("value", ["maybe", "2", "tru"])
async def test_a_flag_that_is_neither_yes_nor_no_is_422(client, alice, value):
    response = await client.get(f"{API}/run?all={value}", headers=alice["headers"])
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "all"
    for accepted in ("false", "0", "no", "off", ""):
        assert (await client.get(f"{API}/run?all={accepted}", headers=alice["headers"])).status_code == 200
