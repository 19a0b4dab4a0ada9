"""Cursor paging of the lists that grow (SPEC §10), on both stores: every row exactly
once, in the list's order, ties on the time broken by id; opaque cursors; 422s."""

from __future__ import annotations

import datetime as dt

import pytest

from orchestra.db.models import Provider, RunEvent, Upload, Worker, WorkflowRun, WorkflowTemplate
from orchestra.services.paging import encode_cursor

API = "/api/v1"
T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


@pytest.fixture
def database_url(both_stores: str) -> str:
    return both_stores



@pytest.fixture
async def bob(users):
    return await users.make("bob")


def stamps(n: int) -> list[dt.datetime]:
    """Times with ties (three rows a millisecond) and microsecond-less values."""
    return [T0 + dt.timedelta(milliseconds=i // 3) for i in range(n)]


async def walk(client, who, path: str, key: str, limit: int, **params) -> tuple[list[dict], int]:
    """Every row of a paged list, following next_cursor; and the number of pages."""
    rows, cursor, pages = [], None, 0
    while True:
        query = {"limit": limit, **params, **({"cursor": cursor} if cursor else {})}
        response = await client.get(f"{API}{path}", headers=who["headers"], params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body[key]) <= limit
        rows += body[key]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return rows, pages
        assert len(body[key]) == limit  # only a full page says more may follow


async def add_runs(owner_id: str, n: int, status: str = "succeeded") -> list[WorkflowRun]:
    rows = [
        dict(trace_id=f"{i:04d}-{owner_id[:8]}-run", owner=owner_id, template_name="t", steps=[],
             status=status, created_at=at)
        for i, at in enumerate(stamps(n))
    ]
    await WorkflowRun.insert_many(rows).aexecute()
    return rows


async def test_runs_page_newest_first_each_once(client, alice, bob):
    mine = await add_runs(alice["user_id"], 23)
    await add_runs(bob["user_id"], 5)
    rows, pages = await walk(client, alice, "/workflow/run", "runs", limit=4)
    assert pages == 6
    expected = sorted(mine, key=lambda r: (r["created_at"], r["trace_id"]), reverse=True)
    assert [r["trace_id"] for r in rows] == [r["trace_id"] for r in expected]


async def test_all_runs_for_an_administrator_are_paged_too(client, alice, bob, users):
    admin = await users.make("root", role="ADMINISTRATOR")
    await add_runs(alice["user_id"], 7)
    await add_runs(bob["user_id"], 6)
    rows, _ = await walk(client, admin, "/workflow/run", "runs", limit=5, all="true")
    assert len(rows) == 13 and len({r["trace_id"] for r in rows}) == 13


async def test_a_page_that_fits_has_no_cursor(client, alice):
    await add_runs(alice["user_id"], 3)
    body = (await client.get(f"{API}/workflow/run?limit=3", headers=alice["headers"])).json()
    assert len(body["runs"]) == 3 and body["next_cursor"] is None
    body = (await client.get(f"{API}/workflow/run", headers=alice["headers"])).json()
    assert len(body["runs"]) == 3 and body["next_cursor"] is None


@pytest.mark.parametrize("cursor", ["", "x", "not-a-cursor", "%00", "eyJ4IjoxfQ", "A" * 600])
async def test_a_cursor_the_server_did_not_give_is_422(client, alice, cursor):
    await add_runs(alice["user_id"], 3)
    response = await client.get(f"{API}/workflow/run?limit=1&cursor={cursor}", headers=alice["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "ValidationError"
    assert response.json()["detail"][0]["field"] == "cursor"


async def test_a_cursor_of_another_list_is_422(client, alice):
    await add_runs(alice["user_id"], 3)
    foreign = encode_cursor("template", T0, "x")
    response = await client.get(f"{API}/workflow/run?cursor={foreign}", headers=alice["headers"])
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "cursor"


async def test_any_cursor_of_the_documented_form_is_a_position(client, alice):
    """A cursor the server did not give, but of the form the document states, pages from
    that position (runs are newest first): before every run there is nothing older, after
    them all every run, at T0 and the id 0001 only the run 0000-…"""
    await add_runs(alice["user_id"], 3)
    for cursor, count in (("run.0.0", 0), ("run.99999999999999999.z", 3), ("run.1767268800000000.0001", 1)):
        response = await client.get(f"{API}/workflow/run?cursor={cursor}", headers=alice["headers"])
        assert response.status_code == 200, response.text
        assert len(response.json()["runs"]) == count, cursor
    for path, kind in (("/workflow/template", "template"), ("/agent/worker", "worker"),
                       ("/adapter/client/upload", "file")):
        response = await client.get(f"{API}{path}?cursor={kind}.0.0", headers=alice["headers"])
        assert response.status_code == 200, (path, response.text)


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "", "1.5", "２"])
async def test_limit_out_of_range_is_422(client, alice, limit):
    for path in ("/workflow/run", "/workflow/template", "/agent/worker", "/adapter/client/upload"):
        response = await client.get(f"{API}{path}?limit={limit}", headers=alice["headers"])
        assert response.status_code == 422, (path, response.text)
        assert response.json()["detail"][0]["field"] == "limit"


async def test_templates_workers_and_files_are_paged_oldest_first(client, alice, bob):
    core = client.app.ctx.core
    provider = await Provider.acreate(name="p", name_key="p", kind="openai", model_id="m")
    times = stamps(11)
    await WorkflowTemplate.insert_many([
        dict(id=f"t{i:03d}", owner=alice["user_id"], name=f"t{i}", name_key=f"t{i}", steps=[],
             created_at=at) for i, at in enumerate(times)
    ] + [dict(id="tshared", owner=bob["user_id"], name="s", name_key="s", steps=[], shared=True,
              created_at=T0 + dt.timedelta(seconds=9)),
         dict(id="tbob", owner=bob["user_id"], name="b", name_key="b", steps=[], created_at=T0)]).aexecute()
    await Worker.insert_many([
        dict(id=f"w{i:03d}", owner=alice["user_id"], name=f"w{i}", name_key=f"w{i}", provider=provider.id,
             tools=[], created_at=at) for i, at in enumerate(times)
    ]).aexecute()
    await Upload.insert_many([
        dict(id=f"f{i:03d}", owner=alice["user_id"], filename="a.txt", size=1, content_type="text/plain",
             sha256="0" * 64, created_at=at) for i, at in enumerate(times)
    ]).aexecute()
    assert core is not None
    templates, _ = await walk(client, alice, "/workflow/template", "templates", limit=4)
    assert [t["template_id"] for t in templates] == [f"t{i:03d}" for i in range(11)] + ["tshared"]
    workers, _ = await walk(client, alice, "/agent/worker", "workers", limit=3)
    assert [w["worker_id"] for w in workers] == [f"w{i:03d}" for i in range(11)]
    files, pages = await walk(client, alice, "/adapter/client/upload", "files", limit=5)
    assert [f["file_id"] for f in files] == [f"f{i:03d}" for i in range(11)] and pages == 3
    bobs, _ = await walk(client, bob, "/agent/worker", "workers", limit=3)
    assert bobs == []


async def test_events_are_paged_by_seq_with_next_after(client, alice):
    (run,) = await add_runs(alice["user_id"], 1)
    await RunEvent.insert_many([
        dict(run=run["trace_id"], seq=seq, kind="token", data={"text": str(seq)}) for seq in range(1, 26)
    ]).aexecute()
    seen, after = [], 0
    while after is not None:
        response = await client.get(f"{API}/workflow/run/{run['trace_id']}/events",
                                    params={"after": after, "limit": 10}, headers=alice["headers"])
        assert response.status_code == 200, response.text
        body = response.json()
        seen += [e["seq"] for e in body["events"]]
        after = body["next_after"]
        if after is not None:
            assert after == body["events"][-1]["seq"]
    assert seen == list(range(1, 26))
    whole = (await client.get(f"{API}/workflow/run/{run['trace_id']}/events", headers=alice["headers"])).json()
    assert [e["seq"] for e in whole["events"]] == seen and whole["next_after"] is None
    for bad in ("limit=0", "limit=1001", "after=", "after=-1", "limit="):
        response = await client.get(f"{API}/workflow/run/{run['trace_id']}/events?{bad}",
                                    headers=alice["headers"])
        assert response.status_code == 422, (bad, response.text)
