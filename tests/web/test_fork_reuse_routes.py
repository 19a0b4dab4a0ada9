"""What a fork reuses beyond its up-front plan (SPEC §13, engine/reuse.py), in process, on
both stores, against the fake model counting its calls: items of a map whose list comes
from a step that runs again, iterations of a loop whose own settings changed, and calls
whose worker changed. Every prompt starts with a word naming its step."""

from __future__ import annotations

import pytest

from orchestra.db.models import RunEvent, RunStep
from tests.conftest import LOOPBACK_STEPS
from tests.web.test_workflow_routes import API, make_template, wait_for


@pytest.fixture
def settings_overrides():
    return dict(LOOPBACK_STEPS)  # an HTTP step calls the fake model's loopback address


@pytest.fixture
def database_url(both_stores: str) -> str:
    return both_stores


@pytest.fixture
async def worker(alice, make_worker):
    return await make_worker(alice, [])


def agent(worker, sid, prompt, depends_on=(), **extra):
    return {"id": sid, "agent": {"worker": worker}, "prompt": prompt, "depends_on": list(depends_on), **extra}


async def run_of(client, who, tid, value, **extra) -> dict:
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": tid, "input": value, **extra})
    assert started.status_code == 202, started.text
    run = await wait_for(client, who, started.json()["trace_id"], "succeeded", "failed")
    assert run["status"] == "succeeded", run.get("error")
    return run


async def fork_of(client, who, trace_id, **body) -> dict:
    answer = await client.post(f"{API}/run/{trace_id}/fork", headers=who["headers"], json=body)
    assert answer.status_code == 202, answer.text
    run = await wait_for(client, who, answer.json()["trace_id"], "succeeded", "failed")
    assert run["status"] == "succeeded", run.get("error")
    return run


def prompts_since(fake_llm, since: int) -> list[str]:
    return sorted(r["messages"][-1]["content"] for r in fake_llm.chat_requests[since:])


async def events_of(trace_id: str) -> list[tuple[str, dict]]:
    rows = await RunEvent.select().where(RunEvent.run == trace_id).order_by(RunEvent.seq).aexecute()
    return [(e.kind, e.data) for e in rows]


async def rows_of(trace_id: str) -> dict[str, RunStep]:
    return {r.path: r for r in await RunStep.select().where(RunStep.run == trace_id).aexecute()}


LIST = {"type": "array", "items": {"type": "string"}}
INPUT = {"type": "object", "properties": {"v": {"type": "integer"}, "items": LIST}}


def mapped_template(worker) -> list[dict]:
    """`plan` answers the input's list (and reads `v`); `each` maps it one call per item,
    `deep` maps it with two steps per item; `after` reads the map's output."""
    return [
        agent(worker, "plan", "plan {{ input.v }} fake:value={{ input.items }}", output_schema=LIST),
        {"id": "each", "foreach": {"items": "steps.plan.output"}, "agent": {"worker": worker},
         "prompt": "each {{ item }}", "depends_on": ["plan"]},
        {"id": "deep", "foreach": {"items": "steps.plan.output"}, "depends_on": ["plan"],
         "steps": [agent(worker, "fetch", "fetch {{ item }}"),
                   agent(worker, "sum", "sum {{ steps.fetch.output }}", ["fetch"])]},
        agent(worker, "after", "after {{ steps.each.output }}", ["each", "deep"]),
    ]


async def test_items_of_a_list_from_a_step_that_runs_again_are_reused_one_by_one(
        client, alice, worker, fake_llm):
    tid = (await make_template(client, alice, mapped_template(worker), input_schema=INPUT))["template_id"]
    source = await run_of(client, alice, tid, {"v": 1, "items": ["a", "b", "c"]})
    assert len(fake_llm.chat_requests) == 1 + 3 + 6 + 1
    stored = await rows_of(source["trace_id"])
    assert all(stored[p].reuse_key for p in ("plan", "each[0]", "deep[1].fetch", "deep[1].sum", "after"))
    assert stored["each"].reuse_key is None and stored["deep[1]"].reuse_key is None  # containers make no call
    since = len(fake_llm.chat_requests)

    # `plan` runs again (`v` changed) and answers c, b, x: its list is known only then
    run = await fork_of(client, alice, source["trace_id"], input={"v": 2, "items": ["c", "b", "x"]})
    called = prompts_since(fake_llm, since)
    assert called == sorted(['plan 2 fake:value=["c","b","x"]', "each x", "fetch x", "sum Echo: fetch x",
                             'after ["Echo: each c","Echo: each b","Echo: each x"]'])
    rows = await rows_of(run["trace_id"])
    assert [rows[f"each[{n}]"].reused for n in range(3)] == [True, True, False]
    assert [rows[f"deep[{n}].fetch"].reused for n in range(3)] == [True, True, False]
    assert rows["each[0]"].output == "Echo: each c" and rows["deep[0].sum"].output == "Echo: sum Echo: fetch c"
    assert rows["each[0]"].usage is None and rows["each[0]"].reuse_key == stored["each[2]"].reuse_key
    assert not rows["plan"].reused and not rows["each"].reused  # they ran: no copy of them
    events = await events_of(run["trace_id"])
    reused = {d["path"]: d for kind, d in events if kind == "step_reused"}
    assert set(reused) == {"each[0]", "each[1]", "deep[0].fetch", "deep[0].sum", "deep[1].fetch", "deep[1].sum"}
    assert reused["each[0]"]["source_path"] == "each[2]" and "source_path" not in reused["each[1]"]
    assert {d["source_trace_id"] for d in reused.values()} == {source["trace_id"]}
    assert reused["each[0]"]["output"] == "Echo: each c"
    started = {d["path"] for kind, d in events if kind == "step_started"}
    assert not started & set(reused)

    # `from_step`: the step and everything downstream of it run again, whatever they read
    since = len(fake_llm.chat_requests)
    again = await fork_of(client, alice, source["trace_id"], from_step="plan")
    assert len(prompts_since(fake_llm, since)) == 1 + 3 + 6 + 1
    assert again["forked_from"] == {"trace_id": source["trace_id"], "from_step": "plan"}
    assert not [d for kind, d in await events_of(again["trace_id"]) if kind == "step_reused"]


async def test_a_changed_worker_runs_its_steps_again_planned_or_at_run_time(client, alice, worker, fake_llm):
    h = alice["headers"]
    provider = (await client.get(f"/api/v1/agent/worker/{worker}", headers=h)).json()["provider_id"]
    other = await client.post("/api/v1/agent/worker", headers=h,
                              json={"name": "other", "provider_id": provider, "tools": []})
    assert other.status_code == 201, other.text
    other = other.json()["worker_id"]
    steps = mapped_template(worker)
    steps.append(agent(other, "aside", "aside {{ input.items }}"))
    tid = (await make_template(client, alice, steps, input_schema=INPUT))["template_id"]
    source = await run_of(client, alice, tid, {"v": 1, "items": ["a", "b"]})

    since = len(fake_llm.chat_requests)  # nothing changed: nothing is called
    same = await fork_of(client, alice, source["trace_id"])
    assert prompts_since(fake_llm, since) == []
    assert all(s["reused"] for s in same["steps"])

    # the worker's system prompt changed: every step of it runs again; `aside` (other worker) does not
    changed = await client.put(f"/api/v1/agent/worker/{worker}", headers=h, json={"system_prompt": "Be brief."})
    assert changed.status_code == 200, changed.text
    since = len(fake_llm.chat_requests)
    run = await fork_of(client, alice, source["trace_id"])
    assert len(prompts_since(fake_llm, since)) == 1 + 2 + 4 + 1
    assert {r["messages"][0]["content"] for r in fake_llm.chat_requests[since:]} == {"Be brief."}
    assert {s["path"] for s in run["steps"] if s["reused"]} == {"aside"}

    # at run time too: `plan` runs again (from `v`), its list is the same, the worker changed once more
    changed = await client.put(f"/api/v1/agent/worker/{worker}", headers=h, json={"model": "fake-model-large"})
    assert changed.status_code == 200, changed.text
    since = len(fake_llm.chat_requests)
    latest = await fork_of(client, alice, run["trace_id"], input={"v": 2, "items": ["a", "b"]})
    assert len(prompts_since(fake_llm, since)) == 1 + 2 + 4 + 1
    assert {r["model"] for r in fake_llm.chat_requests[since:]} == {"fake-model-large"}

    since = len(fake_llm.chat_requests)  # unchanged since: the items are reused at run time
    run = await fork_of(client, alice, latest["trace_id"], input={"v": 3, "items": ["a", "b"]})
    assert prompts_since(fake_llm, since) == ['plan 3 fake:value=["a","b"]']
    rows = await rows_of(run["trace_id"])
    assert rows["each[1]"].reused and rows["deep[1].sum"].reused and rows["after"].reused


def loop_template(worker, until: str, most: int) -> list[dict]:
    return [{"id": "improve", "loop": {"steps": [agent(worker, "draft", "draft {{ loop.iteration }}")],
                                       "until": until, "max_iterations": most}},
            agent(worker, "final", "final {{ steps.improve.output }}", ["improve"])]


async def test_a_loop_whose_settings_changed_keeps_the_iterations_it_still_runs(client, alice, worker, fake_llm):
    h = alice["headers"]
    tid = (await make_template(client, alice, loop_template(worker, "loop.iteration >= 2", 5)))["template_id"]
    source = await run_of(client, alice, tid, "x")
    assert prompts_since(fake_llm, 0) == ["draft 1", "draft 2", "final Echo: draft 2"]

    async def version(until: str, most: int) -> int:
        saved = await client.put(f"{API}/template/{tid}", headers=h,
                                 json={"name": "t", "steps": loop_template(worker, until, most)})
        assert saved.status_code == 200, saved.text
        return saved.json()["template"]["version"]

    longer = await version("loop.iteration >= 4", 5)  # goes on: iterations 1-2 kept, 3-4 run
    since = len(fake_llm.chat_requests)
    run = await fork_of(client, alice, source["trace_id"], version=longer)
    assert prompts_since(fake_llm, since) == ["draft 3", "draft 4", "final Echo: draft 4"]
    rows = await rows_of(run["trace_id"])
    assert [rows[f"improve#{n}"].reused for n in range(1, 5)] == [True, True, False, False]
    assert rows["improve#2.draft"].reused and not rows["improve"].reused
    events = await events_of(run["trace_id"])
    assert {d["path"] for kind, d in events if kind == "step_reused"} == {
        "improve#1", "improve#1.draft", "improve#2", "improve#2.draft"}
    finished = [d for kind, d in events if kind == "step_finished" and d["path"] == "improve"]
    assert finished[0]["iterations"] == 4 and finished[0]["output"] == "Echo: draft 4"

    shorter = await version("loop.iteration >= 1", 5)  # ends sooner: iteration 1 kept, nothing more
    since = len(fake_llm.chat_requests)
    run = await fork_of(client, alice, source["trace_id"], version=shorter)
    assert prompts_since(fake_llm, since) == ["final Echo: draft 1"]
    rows = await rows_of(run["trace_id"])
    assert rows["improve#1"].reused and "improve#2" not in rows

    capped = await version("loop.iteration >= 2", 3)  # only max_iterations changed: the same 2 iterations
    since = len(fake_llm.chat_requests)
    run = await fork_of(client, alice, source["trace_id"], version=capped)
    assert prompts_since(fake_llm, since) == []
    rows = await rows_of(run["trace_id"])
    assert rows["improve#2"].reused and rows["final"].reused and not rows["improve"].reused


async def test_a_version_that_changes_a_step_kind_forks_and_runs_it_again(client, alice, worker, fake_llm):
    h = alice["headers"]
    steps = [agent(worker, "one", "one {{ input.v }}"), agent(worker, "two", "two"), agent(worker, "three", "three"),
             {"id": "four", "foreach": {"items": "input.items"}, "agent": {"worker": worker}, "prompt": "four {{ item }}"}]
    tid = (await make_template(client, alice, steps, input_schema=INPUT))["template_id"]
    source = await run_of(client, alice, tid, {"v": 1, "items": ["a", "b"]})
    swapped = [steps[0],
               {"id": "two", "foreach": {"items": "input.items"}, "agent": {"worker": worker}, "prompt": "two"},
               {"id": "three", "loop": {"steps": [agent(worker, "inner", "inner")], "until": "true",
                                        "max_iterations": 1}},
               agent(worker, "four", "four {{ input.items }}")]
    saved = await client.put(f"{API}/template/{tid}", headers=h,
                             json={"name": "t", "steps": swapped, "input_schema": INPUT})
    assert saved.status_code == 200, saved.text
    since = len(fake_llm.chat_requests)
    run = await fork_of(client, alice, source["trace_id"], version=2)
    assert prompts_since(fake_llm, since) == ['four ["a","b"]', "inner", "two", "two"]
    assert {s["path"] for s in run["steps"] if s["reused"]} == {"one"}


async def test_an_http_step_runs_again_when_what_it_sends_reads_a_changed_input(client, alice, worker, fake_llm):
    ping = {"id": "ping", "http": {"method": "GET", "url": f"{fake_llm.base_url}/models",
                                   "headers": {"Authorization": "Bearer k", "X-V": "{{ input.v }}"}}}
    steps = [ping, agent(worker, "one", "one {{ input.items }}")]
    tid = (await make_template(client, alice, steps, input_schema=INPUT))["template_id"]

    def sent() -> list[str]:
        return [next(v for k, v in r.headers.items() if k.lower() == "x-v")
                for r in fake_llm.requests if r.method == "GET"]

    source = await run_of(client, alice, tid, {"v": 1, "items": []})
    assert sent() == ["1"]
    same = await fork_of(client, alice, source["trace_id"], input={"v": 1, "items": ["x"]})
    assert sent() == ["1"] and {s["path"] for s in same["steps"] if s["reused"]} == {"ping"}
    changed = await fork_of(client, alice, source["trace_id"], input={"v": 2, "items": []})
    assert sent() == ["1", "2"] and {s["path"] for s in changed["steps"] if s["reused"]} == {"one"}
