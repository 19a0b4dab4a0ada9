"""Spend in process (SPEC §12): each step's exact cost, the run's total, budgets that
fail or pause a run before a call they cannot pay for, a top-up from the API, usage
reports, and a provider's 429 waited out without using a retry."""

from __future__ import annotations

import asyncio
import itertools
from decimal import Decimal

import pytest

from orchestra.db.models import WorkflowRun

API = "/api/v1/workflow"
NAMES = itertools.count()


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"llm_max_tokens": 10, "llm_retries": 0}


def chain(worker: str, n: int, prompt: str = "Say {{input}} fake:cached=2") -> list[dict]:
    return [{"id": f"s{i}", "agent": {"worker": worker}, "prompt": prompt,
             "depends_on": [f"s{i - 1}"] if i else []} for i in range(n)]


async def start(client, who, steps, *, limits=None, **run):
    extra = {"limits": limits} if limits else {}
    made = await client.post(f"{API}/template", headers=who["headers"],
                             json={"name": f"t{next(NAMES)}", "steps": steps, **extra})
    assert made.status_code == 201, made.text
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": made.json()["template_id"], "input": "hi", **run})
    assert started.status_code == 202, started.text
    return started.json()["trace_id"]


async def wait_for(client, who, trace_id, *statuses, timeout=15.0):
    for _ in range(int(timeout / 0.02)):
        body = (await client.get(f"{API}/run/{trace_id}", headers=who["headers"])).json()
        if body["status"] in statuses:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"status stayed {body['status']}")


async def events(client, who, trace_id):
    body = (await client.get(f"{API}/run/{trace_id}/events", headers=who["headers"])).json()
    return body["events"]


def expected(usage: dict) -> Decimal:
    cached = usage.get("cached_tokens", 0)
    return (Decimal(usage["prompt_tokens"] - cached) * 1000 + Decimal(cached) * 500
            + Decimal(usage["completion_tokens"]) * 2000) / 1_000_000


async def test_each_step_costs_its_usage_times_price_and_the_run_their_sum(client, alice, priced, fake_llm):
    trace_id = await start(client, alice, chain(priced["worker"], 2))
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "succeeded", run
    total = Decimal(0)
    for step in run["steps"]:
        assert step["usage"]["cached_tokens"] == 2
        assert Decimal(step["cost_usd"]) == expected(step["usage"])
        total += Decimal(step["cost_usd"])
    assert Decimal(run["cost_usd"]) == total and run["budget_usd"] is None
    finished = [e for e in await events(client, alice, trace_id) if e["kind"] == "step_finished"]
    assert [e["data"]["cost_usd"] for e in finished] == [s["cost_usd"] for s in run["steps"]]
    assert all(r["max_tokens"] == 10 for r in fake_llm.chat_requests)


async def test_fail_budget_stops_before_the_call_it_cannot_pay(client, alice, priced, fake_llm):
    # each call reserves $0.12 (an upper bound of 100 prompt tokens: 20 bytes, 64 for the
    # request, 16 for its message; and 10 answer tokens) and costs $0.01: a budget of
    # $0.125 pays for the first call only.
    trace_id = await start(client, alice, chain(priced["worker"], 3), limits={"budget_usd": "0.5"},
                           budget_usd=0.125)
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "failed" and run["budget_usd"] == "0.125"
    assert len(fake_llm.chat_requests) == 1
    assert Decimal(run["cost_usd"]) == Decimal(run["steps"][0]["cost_usd"]) == Decimal("0.01")
    kinds = [e["kind"] for e in await events(client, alice, trace_id)]
    assert kinds[-2:] == ["budget_exceeded", "run_failed"]
    exceeded = [e for e in await events(client, alice, trace_id) if e["kind"] == "budget_exceeded"][0]
    assert {k: exceeded["data"][k] for k in ("budget_usd", "spent_usd")} == {"budget_usd": "0.125", "spent_usd": "0.01"}


async def test_pause_waits_for_a_top_up_and_goes_on_without_calling_finished_steps(
        client, alice, priced, fake_llm):
    trace_id = await start(client, alice, chain(priced["worker"], 3),
                           limits={"budget_usd": 0.125, "on_budget": "pause"})
    run = await wait_for(client, alice, trace_id, "waiting_budget", "failed", "succeeded")
    assert run["status"] == "waiting_budget"
    row = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert row.owner_process is None and row.lease_until is None  # nobody holds it
    assert (await events(client, alice, trace_id))[-1]["kind"] == "budget_exhausted"
    bad = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": -1})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "add_usd"
    bad = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": "lots"})
    assert bad.status_code == 422
    raised = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": "1"})
    assert raised.status_code == 200, raised.text
    assert raised.json()["budget_usd"] == "1.125"
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "succeeded"
    assert len(fake_llm.chat_requests) == 3  # s0 was not called again
    again = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": 1})
    assert again.status_code == 409 and again.json()["error"] == "ConflictError"


async def test_under_a_budget_an_unpriced_model_is_never_called(client, alice, make_worker, fake_llm):
    worker = await make_worker(alice, [])
    trace_id = await start(client, alice, chain(worker, 1), budget_usd="5")
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "failed"
    assert "fake" in run["steps"][0]["error"] and "prices" in run["steps"][0]["error"]
    assert fake_llm.chat_requests == []
    unbudgeted = await start(client, alice, chain(worker, 1))
    run = await wait_for(client, alice, unbudgeted, "succeeded", "failed")
    assert run["status"] == "succeeded" and run["cost_usd"] is None
    assert run["steps"][0]["cost_usd"] is None


@pytest.mark.parametrize("bad", [-1, "x", True, "1e999999"])
async def test_a_bad_budget_at_start_is_422_naming_budget_usd(client, alice, priced, bad):
    made = await client.post(f"{API}/template", headers=alice["headers"],
                             json={"name": "t", "steps": chain(priced["worker"], 1)})
    response = await client.post(f"{API}/run", headers=alice["headers"], json={
        "template_id": made.json()["template_id"], "input": "hi", "budget_usd": bad})
    assert response.status_code == 422, response.text
    assert "budget_usd" in {d["field"] for d in response.json()["detail"]}
    assert await client.app.ctx.core.db.count(WorkflowRun.select()) == 0


async def test_a_bad_template_budget_is_422_naming_the_field(client, alice, priced):
    response = await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": "t", "steps": chain(priced["worker"], 1), "limits": {"budget_usd": -2}})
    assert response.status_code == 422
    assert "limits.budget_usd" in {d["field"] for d in response.json()["detail"]}
    for bad in (True, "ten", {"usd": 1}):
        response = await client.post(f"{API}/template", headers=alice["headers"], json={
            "name": "t", "steps": chain(priced["worker"], 1), "limits": {"budget_usd": bad}})
        assert response.status_code == 422, bad
        assert "limits.budget_usd" in {d["field"] for d in response.json()["detail"]}
    response = await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": "t", "steps": chain(priced["worker"], 1), "limits": {"on_budget": "shrug"}})
    assert "limits.on_budget" in {d["field"] for d in response.json()["detail"]}


async def test_usage_groups_calls_tokens_and_costs(client, alice, admin, priced):
    trace_id = await start(client, alice, chain(priced["worker"], 2))
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    by_model = (await client.get("/api/v1/usage?group_by=model", headers=alice["headers"])).json()
    assert by_model["rows"] == [{
        "key": "fake-model", "runs": 1, "calls": 2,
        "input_tokens": sum(s["usage"]["prompt_tokens"] for s in run["steps"]),
        "output_tokens": sum(s["usage"]["completion_tokens"] for s in run["steps"]),
        "cost_usd": run["cost_usd"]}]
    day = run["finished_at"][:10]
    by_day = (await client.get(f"/api/v1/usage?group_by=day&from={day}&to={day}",
                               headers=alice["headers"])).json()
    assert [r["key"] for r in by_day["rows"]] == [day]
    none = (await client.get("/api/v1/usage?group_by=user&to=2000-01-01", headers=alice["headers"])).json()
    assert none["rows"] == []
    assert (await client.get("/api/v1/usage", headers=admin["headers"])).json()["rows"][0]["runs"] == 1
    assert (await client.get("/api/v1/usage", headers=admin["headers"] | {})).status_code == 200
    mine = (await client.get("/api/v1/usage?group_by=user", headers=admin["headers"])).json()
    assert [r["key"] for r in mine["rows"]] == [alice["user_id"]]
    bad = await client.get("/api/v1/usage?group_by=planet", headers=alice["headers"])
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "group_by"
    bad = await client.get("/api/v1/usage?from=yesterday", headers=alice["headers"])
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "from"
    bad = await client.get("/api/v1/usage?to=", headers=alice["headers"])  # empty is not a date
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "to"


async def test_a_429_is_waited_out_without_using_a_retry(client, alice, priced, fake_llm):
    fake_llm.script_error(429, retry_after=0.05).script_error(429, retry_after=0.05)
    trace_id = await start(client, alice, chain(priced["worker"], 1))  # ORCHESTRA_LLM_RETRIES=0
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "succeeded", run
    assert len(fake_llm.chat_requests) == 3
    assert run["steps"][0]["attempt"] == 1


async def test_usage_groups_by_workspace_and_members_see_their_team_runs(client, alice, admin, users, priced):
    """`group_by=workspace` keys rows by workspace_id, named after the workspace; a team's
    members see its runs' usage, an outsider (an ADMINISTRATOR too) does not (SPEC §16)."""
    bob, eve = await users.make("bob"), await users.make("eve")
    team = (await client.post("/api/v1/workspace", headers=alice["headers"], json={"name": "Ops"})).json()
    wid = team["workspace_id"]
    added = await client.post(f"/api/v1/workspace/{wid}/member", headers=alice["headers"],
                              json={"user_name": "bob", "role": "viewer"})
    assert added.status_code == 201, added.text
    own = await start(client, alice, chain(priced["worker"], 1))
    ops = await client.post("/api/v1/agent/worker", headers=alice["headers"],  # the team's own worker
                            json={"name": "ops-w", "provider_id": priced["provider"], "workspace_id": wid})
    assert ops.status_code == 201, ops.text
    made = await client.post(f"{API}/template", headers=alice["headers"],
                             json={"name": "ops", "steps": chain(ops.json()["worker_id"], 2), "workspace_id": wid})
    assert made.status_code == 201, made.text
    started = await client.post(f"{API}/run", headers=alice["headers"],
                                json={"template_id": made.json()["template_id"], "input": "hi"})
    assert started.status_code == 202, started.text
    for trace_id in (own, started.json()["trace_id"]):
        assert (await wait_for(client, alice, trace_id, "succeeded", "failed"))["status"] == "succeeded"
    [personal] = [w for w in (await client.get("/api/v1/workspace", headers=alice["headers"])).json()["workspaces"]
                  if w["personal"]]
    rows = (await client.get("/api/v1/usage?group_by=workspace", headers=alice["headers"])).json()["rows"]
    assert sorted((r["key"], r["name"], r["runs"], r["calls"]) for r in rows) == sorted(
        [(personal["workspace_id"], "alice", 1, 1), (wid, "Ops", 1, 2)])
    seen = (await client.get("/api/v1/usage?group_by=workspace", headers=bob["headers"])).json()["rows"]
    assert [(r["key"], r["runs"], r["calls"]) for r in seen] == [(wid, 1, 2)]
    assert (await client.get("/api/v1/usage?group_by=workspace", headers=eve["headers"])).json()["rows"] == []
    everyone = (await client.get("/api/v1/usage?group_by=workspace", headers=admin["headers"])).json()["rows"]
    assert [r["key"] for r in everyone] == [personal["workspace_id"]]  # no member of Ops
    # ?workspace_id= : that workspace's runs alone; a non-member's is 404, a blank one 422
    only = (await client.get(f"/api/v1/usage?group_by=workspace&workspace_id={wid}",
                             headers=alice["headers"])).json()["rows"]
    assert [(r["key"], r["runs"], r["calls"]) for r in only] == [(wid, 1, 2)]
    mine = (await client.get(f"/api/v1/usage?group_by=workspace&workspace_id={personal['workspace_id']}",
                             headers=alice["headers"])).json()["rows"]
    assert [(r["key"], r["runs"], r["calls"]) for r in mine] == [(personal["workspace_id"], 1, 1)]
    for who in (eve, admin):
        refused = await client.get(f"/api/v1/usage?workspace_id={wid}", headers=who["headers"])
        assert refused.status_code == 404 and refused.json()["error"] == "NotFoundError", refused.text
    blank = await client.get("/api/v1/usage?workspace_id=", headers=alice["headers"])
    assert blank.status_code == 422 and blank.json()["detail"][0]["field"] == "workspace_id", blank.text
