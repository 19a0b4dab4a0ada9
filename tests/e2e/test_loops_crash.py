"""Durable per instance (SPEC §8): `kill -9` of a run's owner in the middle of a 200-item
foreach, and in the middle of a loop's second iteration, on two `orchestra serve`
processes sharing PostgreSQL. The other process takes the run over; the fake model counts
every prompt, so an item or an iteration that had finished before the kill is seen
never to be called again."""

from __future__ import annotations

from collections import Counter

from orchestra.testing.fake_llm import ScriptedReply
from tests.e2e.test_scale_out import stored, wait_for
from tests.e2e.test_workflow_e2e import sse_frames

ITEMS = 200


def prompts(fake) -> Counter:
    return Counter(body["messages"][-1]["content"] for body in fake.chat_requests)


def finished_paths(events) -> set[str]:
    return {data["path"] for _, kind, data in events if kind == "step_finished" and "path" in data}


def test_kill_9_mid_foreach_of_200_items_resumes_only_unfinished_items(pair):
    _, worker = pair.provider_and_worker(pair.http_a)
    made = pair.http_a.post("/workflow/template", json={
        "name": "map", "input_schema": {"type": "array"},
        "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": 4},
                   "agent": {"worker": worker}, "prompt": "item {{index}}: {{item}}"}]})
    assert made.status_code == 201, made.text
    pair.fake.chunk_delay = 0.01  # a few ms per item, so the kill lands mid-way
    started = pair.http_a.post("/workflow/run", json={
        "template_id": made.json()["template_id"], "input": [f"topic {n}" for n in range(ITEMS)]})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    # A run started on A is claimed by A (it has room): kill A once 40 items are stored.
    wait_for(lambda: len([p for p in finished_paths(stored(pair.http_b, trace_id)) if p.startswith("m[")]) >= 40,
             60)
    pair.a.kill()
    survivor_http = pair.http_b
    done_before = {p for p in finished_paths(stored(survivor_http, trace_id)) if p.startswith("m[")}
    assert 40 <= len(done_before) < ITEMS
    pair.fake.chunk_delay = 0.0
    with survivor_http.stream("GET", f"/workflow/sse/{trace_id}", timeout=120) as response:
        frames = list(sse_frames(response))
    assert frames[-1][1] == "run_finished", frames[-1]
    assert [f for f in frames if f[1] == "run_resumed"], "the survivor took the run over"
    output = frames[-1][2]["output"]
    assert output == [f"Echo: item {n}: topic {n}" for n in range(ITEMS)]
    counted = prompts(pair.fake)
    for path in done_before:  # finished before the kill: called exactly once, ever
        n = int(path[2:-1])
        assert counted[f"item {n}: topic {n}"] == 1, path
    # every item was called; only those in flight at the kill (at most 4) twice
    assert all(counted[f"item {n}: topic {n}"] >= 1 for n in range(ITEMS))
    assert sum(c - 1 for c in counted.values()) <= 4
    rows = survivor_http.get(f"/workflow/run/{trace_id}").json()["steps"]
    assert len([r for r in rows if r["path"].startswith("m[")]) == ITEMS
    assert all(r["status"] == "succeeded" for r in rows)


def test_kill_9_mid_second_loop_iteration_resumes_inside_it(pair):
    _, worker = pair.provider_and_worker(pair.http_a)
    made = pair.http_a.post("/workflow/template", json={
        "name": "improve",
        "steps": [{"id": "improve", "loop": {
            "steps": [
                {"id": "draft", "agent": {"worker": worker}, "prompt": "draft {{loop.iteration}}"},
                {"id": "review", "agent": {"worker": worker}, "depends_on": ["draft"],
                 "prompt": "review {{loop.iteration}}: {{ steps.draft.output }}"},
            ],
            "until": "steps.review.output == 'APPROVED'", "max_iterations": 3}}]})
    assert made.status_code == 201, made.text
    pair.fake.script(
        ScriptedReply(text="first draft"), ScriptedReply(text="not yet"),   # iteration 1
        ScriptedReply(text="second draft"),                                   # 2: draft
        ScriptedReply(text="never seen", initial_delay=60),                   # 2: review (killed)
        ScriptedReply(text="APPROVED"),                                       # 2: review again
    )
    started = pair.http_a.post("/workflow/run", json={"template_id": made.json()["template_id"],
                                                      "input": "x"})
    trace_id = started.json()["trace_id"]
    wait_for(lambda: any(k == "step_started" and d.get("path") == "improve#2.review"
                         for _, k, d in stored(pair.http_b, trace_id)), 30)
    pair.a.kill()
    survivor_http = pair.http_b
    with survivor_http.stream("GET", f"/workflow/sse/{trace_id}", timeout=60) as response:
        frames = list(sse_frames(response))
    assert frames[-1][1] == "run_finished", frames[-1]
    assert frames[-1][2]["output"] == "APPROVED"
    counted = prompts(pair.fake)
    assert counted["draft 1"] == 1 and counted["review 1: first draft"] == 1  # iteration 1: once
    assert counted["draft 2"] == 1  # finished inside iteration 2 before the kill: not again
    assert counted["review 2: second draft"] == 2  # in flight at the kill: once more
    assert "draft 3" not in counted
    finished = {d["path"]: d for _, k, d in frames if k == "step_finished"}
    assert finished["improve"]["iterations"] == 2 and finished["improve"]["exhausted"] is False
