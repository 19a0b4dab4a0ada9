"""Template versions, runs pinned to them and forks (SPEC §13), in process, on both stores."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import RunEvent, RunStep, TemplateVersion
from tests.web.test_workflow_routes import API, assert_error, make_template, wait_for


@pytest.fixture
def database_url(both_stores: str) -> str:
    return both_stores


@pytest.fixture
async def worker(alice, make_worker):
    return await make_worker(alice, [])


def agent(worker, sid, prompt, depends_on=(), **extra):
    return {"id": sid, "agent": {"worker": worker}, "prompt": prompt, "depends_on": list(depends_on), **extra}


async def put(client, who, tid, steps, name="t", **extra):
    return await client.put(f"{API}/template/{tid}", headers=who["headers"],
                            json={"name": name, "steps": steps, **extra})


async def test_every_save_makes_a_version_and_a_refused_one_none(client, alice, users, worker):
    h = alice["headers"]
    created = await make_template(client, alice, [agent(worker, "a", "one {{input}}")])
    tid = created["template_id"]
    assert created["template"]["version"] == 1
    second = await put(client, alice, tid, [agent(worker, "a", "two {{input}}")], description="d")
    assert second.status_code == 200 and second.json()["template"]["version"] == 2
    refused = await put(client, alice, tid, [agent(worker, "a", "{{steps.nope.output}}")])
    assert_error(refused, 422, "ValidationError")
    await make_template(client, alice, [agent(worker, "x", "p")], name="other")
    taken = await put(client, alice, tid, [agent(worker, "a", "three")], name="OTHER")
    assert_error(taken, 409, "ConflictError")
    listed = (await client.get(f"{API}/template/{tid}/versions", headers=h)).json()
    assert [v["version"] for v in listed["versions"]] == [2, 1]
    assert listed["versions"][0]["author_id"] == alice["user_id"] and listed["versions"][0]["step_count"] == 1
    assert set(listed["versions"][0]) == {"version", "created_at", "author_id", "author_name", "step_count"}
    assert listed["versions"][0]["author_name"] == "alice"
    one = (await client.get(f"{API}/template/{tid}/versions/1", headers=h)).json()["version"]
    assert one["version"] == 1 and one["steps"][0]["prompt"] == "one {{input}}" and one["description"] == ""
    for bad in ("3", "0", "x", "99999999999"):
        assert_error(await client.get(f"{API}/template/{tid}/versions/{bad}", headers=h), 404, "NotFoundError")
    bob = await users.make("bob")
    assert_error(await client.get(f"{API}/template/{tid}/versions", headers=bob["headers"]), 404, "NotFoundError")
    diff = (await client.get(f"{API}/template/{tid}/diff?from=1&to=2", headers=h)).json()
    assert diff["added"] == [] and diff["removed"] == []
    assert diff["changed"] == [{"step_id": "a", "fields": ["prompt"]}]
    assert diff["template_fields"] == ["description"]
    assert (await client.get(f"{API}/template/{tid}/diff", headers=h)).json()["changed"] == diff["changed"]
    assert_error(await client.get(f"{API}/template/{tid}/diff?from=1&to=7", headers=h), 404, "NotFoundError")
    assert_error(await client.get(f"{API}/template/{tid}/diff?from=x", headers=h), 422, "ValidationError")
    restored = await client.post(f"{API}/template/{tid}/versions/1/restore", headers=h)
    assert restored.status_code == 201, restored.text
    body = restored.json()
    assert body["version"] == 3 and body["restored_from"] == 1
    assert body["template"]["steps"] == one["steps"] and body["template"]["description"] == ""
    back = (await client.get(f"{API}/template/{tid}/diff?from=1&to=3", headers=h)).json()
    assert back["added"] == back["removed"] == back["changed"] == back["template_fields"] == []
    assert_error(await client.post(f"{API}/template/{tid}/versions/9/restore", headers=h), 404, "NotFoundError")


async def test_concurrent_saves_get_consecutive_numbers(client, alice, worker):
    created = await make_template(client, alice, [agent(worker, "a", "p0")])
    tid = created["template_id"]
    answers = await asyncio.gather(*(put(client, alice, tid, [agent(worker, "a", f"p{n}")])
                                     for n in range(1, 9)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    numbers = sorted(a.json()["template"]["version"] for a in answers)
    assert numbers == list(range(2, 10))
    rows = await TemplateVersion.select().where(TemplateVersion.template == tid).order_by(
        TemplateVersion.version).aexecute()
    assert [r.version for r in rows] == list(range(1, 10))
    latest = (await client.get(f"{API}/template/{tid}", headers=alice["headers"])).json()["template"]
    by_name = [{**s, "agent": {"worker": "w"}} for s in rows[-1].steps]  # read back by name (SPEC §7)
    assert latest["version"] == 9 and latest["steps"] == by_name  # the template is its latest version


async def test_a_run_pinned_to_a_version_and_a_deleted_template(client, alice, worker, fake_llm):
    h = alice["headers"]
    created = await make_template(client, alice, [agent(worker, "a", "v1 {{input}}")])
    tid = created["template_id"]
    for n in (2, 3):
        assert (await put(client, alice, tid, [agent(worker, "a", f"v{n} {{{{input}}}}")])).status_code == 200
    started = await client.post(f"{API}/run", headers=h, json={"template_id": tid, "input": "x", "version": 2})
    assert started.status_code == 202, started.text
    run = await wait_for(client, alice, started.json()["trace_id"], "succeeded")
    assert run["template_version"] == 2 and run["steps"][0]["output"] == "Echo: v2 x"
    latest = await client.post(f"{API}/run", headers=h, json={"template_id": tid, "input": "y"})
    run = await wait_for(client, alice, latest.json()["trace_id"], "succeeded")
    assert run["template_version"] == 3 and run["steps"][0]["output"] == "Echo: v3 y"
    missing = await client.post(f"{API}/run", headers=h, json={"template_id": tid, "version": 4})
    assert_error(missing, 404, "NotFoundError")
    assert_error(await client.post(f"{API}/run", headers=h, json={"template_id": tid, "version": 0}),
                 422, "ValidationError")
    assert (await client.delete(f"{API}/template/{tid}", headers=h)).status_code == 200
    kept = (await client.get(f"{API}/run/{run['trace_id']}", headers=h)).json()
    assert kept["template_id"] is None and kept["template_version"] == 3
    assert kept["steps"][0]["output"] == "Echo: v3 y"
    forked = await client.post(f"{API}/run/{run['trace_id']}/fork", headers=h, json={"from_step": "a"})
    assert forked.status_code == 202, forked.text  # the run's own steps need no template
    assert_error(await client.post(f"{API}/run/{run['trace_id']}/fork", headers=h, json={"version": 1}),
                 404, "NotFoundError")


async def test_fork_reuses_what_nothing_changed(client, alice, users, worker, fake_llm):
    h = alice["headers"]
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
    steps = [agent(worker, "a", "A {{input}}"),
             agent(worker, "b", "B {{steps.a.output}}", ["a"]),
             agent(worker, "c", "C fixed"),
             agent(worker, "d", "D {{steps.c.output}}", ["c"], output_schema=schema),
             agent(worker, "e", "E {{steps.b.output}} {{steps.d.output}}", ["b", "d"])]
    tid = (await make_template(client, alice, steps))["template_id"]
    started = await client.post(f"{API}/run", headers=h, json={"template_id": tid, "input": "x"})
    source = await wait_for(client, alice, started.json()["trace_id"], "succeeded")
    calls = len(fake_llm.chat_requests)

    async def fork(body):
        return await client.post(f"{API}/run/{source['trace_id']}/fork", headers=h, json=body)

    assert_error(await fork({"from_step": "zz"}), 422, "ValidationError")
    bad = assert_error(await fork({"outputs": {"d": {"ok": "yes"}}}), 422, "ValidationError")
    assert bad["detail"] == [{"field": "outputs.d.ok", "problem": '"yes" is not of type "boolean"'}]
    assert assert_error(await fork({"outputs": {"zz": "x"}}), 422, "ValidationError")["detail"][0]["field"] == "outputs.zz"
    assert_error(await fork({"from_step": "b", "outputs": {"e": "x"}}), 422, "ValidationError")
    assert_error(await fork({"from_step": "b", "outputs": {"b": "x"}}), 422, "ValidationError")
    assert_error(await fork({"outputs": {"a": 5}}), 422, "ValidationError")
    assert fake_llm.chat_requests == fake_llm.chat_requests[:calls]  # nothing was started

    answer = await fork({"from_step": "b", "outputs": {"d": {"ok": False}}})
    assert answer.status_code == 202, answer.text
    assert answer.json()["forked_from"] == source["trace_id"]
    run = await wait_for(client, alice, answer.json()["trace_id"], "succeeded", "failed")
    assert run["status"] == "succeeded", run
    assert run["forked_from"] == {"trace_id": source["trace_id"], "from_step": "b"}
    by_id = {s["step_id"]: s for s in run["steps"]}
    assert {sid for sid, s in by_id.items() if s["reused"]} == {"a", "c", "d"}
    assert by_id["d"]["output"] == {"ok": False} and by_id["a"]["output"] == "Echo: A x"
    prompts = [r["messages"][-1]["content"] for r in fake_llm.chat_requests[calls:]]
    assert sorted(p.split()[0] for p in prompts) == ["B", "E"]
    assert any('{"ok":false}' in p for p in prompts if p.startswith("E"))
    events = await RunEvent.select().where(RunEvent.run == run["trace_id"]).order_by(RunEvent.seq).aexecute()
    reused = [e.data for e in events if e.kind == "step_reused"]
    assert sorted(e["step_id"] for e in reused) == ["a", "c", "d"]
    assert all(e["source_trace_id"] == source["trace_id"] for e in reused)
    assert [e["step_id"] for e in reused if e.get("overridden")] == ["d"]
    rows = await RunStep.select().where(RunStep.run == run["trace_id"]).aexecute()
    assert all(r.usage is None for r in rows if r.reused)

    calls = len(fake_llm.chat_requests)
    changed = await fork({"input": "y"})
    run = await wait_for(client, alice, changed.json()["trace_id"], "succeeded")
    again = sorted(r["messages"][-1]["content"].split()[0] for r in fake_llm.chat_requests[calls:])
    assert again == ["A", "B", "E"]
    assert run["input"] == "y"
    bob = await users.make("bob")
    assert_error(await client.post(f"{API}/run/{source['trace_id']}/fork", headers=bob["headers"], json={}),
                 404, "NotFoundError")


async def test_fork_on_another_version_reuses_unchanged_steps(client, alice, worker, fake_llm):
    h = alice["headers"]
    steps = [agent(worker, "a", "A {{input}}"), agent(worker, "b", "B {{steps.a.output}}", ["a"]),
             agent(worker, "c", "C {{input}}")]
    tid = (await make_template(client, alice, steps))["template_id"]
    started = await client.post(f"{API}/run", headers=h, json={"template_id": tid, "input": "x"})
    source = await wait_for(client, alice, started.json()["trace_id"], "succeeded")
    steps[2] = agent(worker, "c", "C2 {{input}}")
    assert (await put(client, alice, tid, steps)).status_code == 200
    calls = len(fake_llm.chat_requests)
    answer = await client.post(f"{API}/run/{source['trace_id']}/fork", headers=h, json={"version": 2})
    run = await wait_for(client, alice, answer.json()["trace_id"], "succeeded")
    assert run["template_version"] == 2
    assert [r["messages"][-1]["content"] for r in fake_llm.chat_requests[calls:]] == ["C2 x"]


async def test_fork_of_a_map_reuses_items_one_by_one(client, alice, worker, fake_llm):
    h = alice["headers"]
    steps = [{"id": "each", "foreach": {"items": "input"}, "agent": {"worker": worker},
              "prompt": "item {{item}}"},
             {"id": "loop", "loop": {"steps": [agent(worker, "draft", "draft {{loop.iteration}}")],
                                     "until": "loop.iteration >= 2", "max_iterations": 3}},
             agent(worker, "last", "{{steps.each.output}}", ["each", "loop"])]
    tid = (await make_template(client, alice, steps, input_schema={"type": "array"}))["template_id"]
    started = await client.post(f"{API}/run", headers=h, json={"template_id": tid, "input": ["p", "q", "r"]})
    source = await wait_for(client, alice, started.json()["trace_id"], "succeeded", "failed")
    assert source["status"] == "succeeded", source["error"]
    calls = len(fake_llm.chat_requests)
    answer = await client.post(f"{API}/run/{source['trace_id']}/fork", headers=h, json={"input": ["p", "z", "r", "s"]})
    run = await wait_for(client, alice, answer.json()["trace_id"], "succeeded")
    prompts = sorted(r["messages"][-1]["content"] for r in fake_llm.chat_requests[calls:])
    assert prompts == sorted(['["Echo: item p","Echo: item z","Echo: item r","Echo: item s"]',
                              "item s", "item z"])  # the changed and new items, and `last`
    paths = {s["path"]: s for s in run["steps"]}
    assert paths["each[0]"]["reused"] and paths["each[2]"]["reused"] and not paths["each[1]"]["reused"]
    assert paths["loop"]["reused"] and paths["loop#2.draft"]["reused"]
    assert paths["each"]["output"] == ["Echo: item p", "Echo: item z", "Echo: item r", "Echo: item s"]


async def test_api_keys_reach_versions_and_fork_within_their_scopes(client, alice, worker):
    steps = [agent(worker, "a", "A {{input}}")]
    tid = (await make_template(client, alice, steps))["template_id"]
    other = (await make_template(client, alice, steps, name="other"))["template_id"]

    async def key(scopes, templates=None):
        made = await client.post("/api/v1/auth/key", headers=alice["headers"],
                                 json={"name": f"k{len(scopes)}{templates}", "scopes": scopes, "templates": templates})
        assert made.status_code == 201, made.text
        return {"Authorization": f"Bearer {made.json()['key']}"}

    reader = await key(["template:read"])
    assert (await client.get(f"{API}/template/{tid}/versions", headers=reader)).status_code == 200
    assert (await client.get(f"{API}/template/{tid}/diff?from=1&to=1", headers=reader)).status_code == 200
    assert_error(await client.post(f"{API}/template/{tid}/versions/1/restore", headers=reader),
                 403, "PermissionDeniedError")
    writer = await key(["template:write"])
    assert (await client.post(f"{API}/template/{tid}/versions/1/restore", headers=writer)).status_code == 201
    started = await client.post(f"{API}/run", headers=alice["headers"], json={"template_id": tid, "input": "x"})
    source = await wait_for(client, alice, started.json()["trace_id"], "succeeded")
    assert_error(await client.post(f"{API}/run/{source['trace_id']}/fork", headers=reader, json={}),
                 403, "PermissionDeniedError")
    narrow = await key(["run:start"], [other])
    assert_error(await client.post(f"{API}/run/{source['trace_id']}/fork", headers=narrow, json={}),
                 403, "PermissionDeniedError")
    starter = await key(["run:start"], [tid])
    assert (await client.post(f"{API}/run/{source['trace_id']}/fork", headers=starter, json={})).status_code == 202
