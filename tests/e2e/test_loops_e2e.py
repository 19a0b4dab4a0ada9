"""SPEC §8 against a real `orchestra serve` (SQLite) and the fake model: foreach over an
expression's list, loops with until/max_iterations, nesting, instance paths on events and
in the run detail, and the save-time rules (422)."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from orchestra.testing.fake_llm import FakeLLM, ScriptedReply
from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login, sse_frames


class World:
    """A server, the fake model, an administrator's client and one worker."""

    def __init__(self, server: ServerProcess, fake: FakeLLM) -> None:
        self.server, self.fake = server, fake
        self.http = httpx.Client(base_url=server.base_url + "/api/v1",
                                 headers=login(server, "admin", "ADMINISTRATOR"), timeout=30)
        provider = self.http.post("/provider", json={
            "name": "fake", "provider": "openai_compatible", "model_id": "fake-model",
            "api_key": "k", "base_url": fake.base_url})
        assert provider.status_code == 201, provider.text
        worker = self.http.post("/agent/worker", json={
            "name": "helper", "provider_id": provider.json()["provider_id"], "tools": []})
        assert worker.status_code == 201, worker.text
        self.worker = {"worker": worker.json()["worker_id"]}

    def template(self, steps: list[dict], **options) -> str:
        self.made = getattr(self, "made", 0) + 1
        made = self.http.post("/workflow/template", json={"name": f"t{self.made}", "steps": steps, **options})
        assert made.status_code == 201, made.text
        return made.json()["template_id"]

    def refused(self, steps: list[dict], **options) -> list[dict]:
        made = self.http.post("/workflow/template", json={"name": "bad", "steps": steps, **options})
        assert made.status_code == 422, made.text
        assert made.json()["error"] == "ValidationError"
        return made.json()["detail"]

    def run(self, template_id: str, input) -> str:
        started = self.http.post("/workflow/run", json={"template_id": template_id, "input": input})
        assert started.status_code == 202, started.text
        return started.json()["trace_id"]

    def events(self, trace_id: str) -> list[tuple[int, str, dict]]:
        with self.http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            return list(sse_frames(response))

    def detail(self, trace_id: str) -> dict:
        return self.http.get(f"/workflow/run/{trace_id}").json()

    def prompts(self) -> Counter:
        """How often each user prompt reached the model."""
        return Counter(body["messages"][-1]["content"] for body in self.fake.chat_requests)


@pytest.fixture
def world(tmp_path):
    with FakeLLM() as fake:
        server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_FOREACH_MAX_ITEMS": "5"}).start()
        try:
            yield World(server, fake)
        finally:
            server.stop()


LIST_INPUT = {"input_schema": {"type": "array"}}


def by_path(events, kind: str) -> dict[str, dict]:
    return {data["path"]: data for _, k, data in events if k == kind}


def test_foreach_runs_one_step_per_item_in_order_with_paths(world):
    tid = world.template([
        {"id": "research", "foreach": {"items": "input", "max_concurrency": 2},
         "agent": world.worker, "prompt": "topic {{index}}: {{item}}"},
        {"id": "sum", "agent": world.worker, "depends_on": ["research"],
         "prompt": "summarise {{ steps.research.output.size() }} results"},
    ], **LIST_INPUT)
    trace = world.run(tid, ["owls", "bees", "moss"])
    events = world.events(trace)
    assert events[-1][1] == "run_finished", events[-1]
    started, finished = by_path(events, "step_started"), by_path(events, "step_finished")
    assert set(started) == {"research", "research[0]", "research[1]", "research[2]", "sum"}
    assert started["research"]["step_id"] == "research" and started["research"]["items"] == 3
    assert started["research[1]"]["step_id"] == "research"
    assert started["research[1]"]["prompt"] == "topic 1: bees"
    expected = ["Echo: topic 0: owls", "Echo: topic 1: bees", "Echo: topic 2: moss"]
    assert finished["research"]["output"] == expected
    assert finished["research"]["items"] == {"total": 3, "succeeded": 3, "failed": 0}
    assert finished["sum"]["output"] == "Echo: summarise 3 results"
    # every step event carries its path
    for _, kind, data in events:
        if "step_id" in data:
            assert "path" in data, (kind, data)
    detail = world.detail(trace)
    assert detail["status"] == "succeeded"
    rows = {s["path"]: s for s in detail["steps"]}
    assert set(rows) == {"research", "research[0]", "research[1]", "research[2]", "sum"}
    assert rows["research[2]"]["step_id"] == "research"
    assert rows["research[2]"]["status"] == "succeeded"
    assert rows["research[2]"]["output"] == "Echo: topic 2: moss"
    assert rows["research"]["output"] == expected
    assert world.prompts() == Counter({"topic 0: owls": 1, "topic 1: bees": 1, "topic 2: moss": 1,
                                       "summarise 3 results": 1})


def test_foreach_max_concurrency_bounds_items_in_flight(world):
    world.fake.chunk_delay = 0.02
    tid = world.template([{"id": "m", "foreach": {"items": "input", "max_concurrency": 2},
                           "agent": world.worker, "prompt": "{{item}} is a word of several parts"}],
                         **LIST_INPUT)
    trace = world.run(tid, ["a", "b", "c", "d", "e"])
    events = world.events(trace)
    assert events[-1][1] == "run_finished"
    open_items, most = set(), 0
    for _, kind, data in events:
        if data.get("path", "").startswith("m["):
            if kind == "step_started":
                open_items.add(data["path"])
            elif kind in ("step_finished", "step_failed"):
                open_items.discard(data["path"])
            most = max(most, len(open_items))
    assert most == 2
    default = world.template([{"id": "m", "foreach": {"items": "input"},  # max_concurrency: 4
                               "agent": world.worker, "prompt": "{{item}} is a word of several parts"}],
                             **LIST_INPUT)
    assert most_in_flight(world.events(world.run(default, list("abcde")))) == 4  # at most 5 items here


def most_in_flight(events) -> int:
    open_items, most = set(), 0
    for _, kind, data in events:
        if data.get("path", "").startswith("m["):
            if kind == "step_started":
                open_items.add(data["path"])
            elif kind in ("step_finished", "step_failed"):
                open_items.discard(data["path"])
            most = max(most, len(open_items))
    return most


def test_foreach_on_error_continue_gives_null_for_the_failed_item(world):
    world.fake.script(
        ScriptedReply(text="first"),
        ScriptedReply(kind="error", status=400, body={"error": {"message": "bad item", "type": "x"}}),
        ScriptedReply(text="third"),
    )
    tid = world.template([{"id": "m", "foreach": {"items": "input", "max_concurrency": 1,
                                                  "on_error": "continue"},
                           "agent": world.worker, "prompt": "{{item}}"}], **LIST_INPUT)
    trace = world.run(tid, ["x", "y", "z"])
    events = world.events(trace)
    assert events[-1][1] == "run_finished", events[-1]
    failed = by_path(events, "step_failed")
    assert list(failed) == ["m[1]"] and "bad item" in failed["m[1]"]["error"]
    finished = by_path(events, "step_finished")
    assert finished["m"]["output"] == ["first", None, "third"]
    assert finished["m"]["items"] == {"total": 3, "succeeded": 2, "failed": 1}
    assert events[-1][2]["output"] == ["first", None, "third"]
    rows = {s["path"]: s for s in world.detail(trace)["steps"]}
    assert rows["m[1]"]["status"] == "failed" and rows["m"]["status"] == "succeeded"


def test_an_item_that_fails_before_it_starts_has_its_own_failed_row(world):
    """An item whose prompt cannot be rendered never starts (no model call), yet it is an
    instance like the others: its row in the run detail says failed, with the reason."""
    tid = world.template([{"id": "m", "foreach": {"items": "input", "on_error": "continue"},
                           "agent": world.worker, "prompt": "{{ item.topic }}"}], **LIST_INPUT)
    trace = world.run(tid, [{"topic": "tides"}, {"title": "no topic"}])
    events = world.events(trace)
    assert events[-1][1] == "run_finished", events[-1]
    assert list(by_path(events, "step_failed")) == ["m[1]"]
    assert "m[1]" not in by_path(events, "step_started")
    rows = {s["path"]: s for s in world.detail(trace)["steps"]}
    assert rows["m[1]"]["status"] == "failed" and "topic" in rows["m[1]"]["error"]
    assert rows["m[0]"]["status"] == "succeeded" and rows["m"]["status"] == "succeeded"
    assert world.prompts() == Counter({"tides": 1})


def test_foreach_on_error_fail_fails_the_run_naming_the_item(world):
    world.fake.script(
        ScriptedReply(text="first"),
        ScriptedReply(kind="error", status=400, body={"error": {"message": "bad item", "type": "x"}}),
    )
    tid = world.template([{"id": "m", "foreach": {"items": "input", "max_concurrency": 1},
                           "agent": world.worker, "prompt": "{{item}}"}], **LIST_INPUT)
    trace = world.run(tid, ["x", "y", "z"])
    events = world.events(trace)
    assert events[-1][1] == "run_failed"
    assert "m[1]" in events[-1][2]["error"] and "bad item" in events[-1][2]["error"]
    assert world.prompts() == Counter({"x": 1, "y": 1})  # z never started
    assert world.detail(trace)["status"] == "failed"


def test_foreach_empty_list_gives_empty_output_and_too_many_items_fail(world):
    tid = world.template([{"id": "m", "foreach": {"items": "input"},
                           "agent": world.worker, "prompt": "{{item}}"}], **LIST_INPUT)
    events = world.events(world.run(tid, []))
    assert events[-1][1] == "run_finished" and events[-1][2]["output"] == []
    assert by_path(events, "step_finished")["m"]["output"] == []
    events = world.events(world.run(tid, [1, 2, 3, 4, 5, 6]))  # ORCHESTRA_FOREACH_MAX_ITEMS=5
    assert events[-1][1] == "run_failed"
    assert "6 items" in events[-1][2]["error"] and "ORCHESTRA_FOREACH_MAX_ITEMS" in events[-1][2]["error"]
    not_a_list = world.template([{"id": "m", "foreach": {"items": "input.things"},
                                  "agent": world.worker, "prompt": "{{item}}"}],
                                input_schema={"type": "object"})
    events = world.events(world.run(not_a_list, {"things": "nope"}))
    assert events[-1][1] == "run_failed" and "not a list" in events[-1][2]["error"]
    assert world.fake.chat_requests == []


def test_foreach_of_a_small_workflow_with_output(world):
    tid = world.template([{
        "id": "each", "foreach": {"items": "input", "max_concurrency": 4},
        "steps": [
            {"id": "fetch", "agent": world.worker, "prompt": "fetch {{item}}"},
            {"id": "judge", "agent": world.worker, "depends_on": ["fetch"],
             "prompt": "judge {{ steps.fetch.output }} ({{index}})"},
        ],
        "output": "{'item': item, 'verdict': steps.judge.output}",
    }], **LIST_INPUT)
    trace = world.run(tid, ["a", "b"])
    events = world.events(trace)
    assert events[-1][1] == "run_finished", events[-1]
    finished = by_path(events, "step_finished")
    assert set(finished) == {"each", "each[0]", "each[1]", "each[0].fetch", "each[0].judge",
                             "each[1].fetch", "each[1].judge"}
    assert finished["each"]["output"] == [
        {"item": "a", "verdict": "Echo: judge Echo: fetch a (0)"},
        {"item": "b", "verdict": "Echo: judge Echo: fetch b (1)"},
    ]
    assert finished["each[1].judge"]["step_id"] == "judge"
    rows = {s["path"]: s for s in world.detail(trace)["steps"]}
    assert rows["each[0].fetch"]["output"] == "Echo: fetch a"


def test_loop_until_approved_with_iteration_and_previous(world):
    world.fake.script(ScriptedReply(text="draft one"), ScriptedReply(text="needs work"),
                      ScriptedReply(text="draft two"), ScriptedReply(text="APPROVED"))
    tid = world.template([{"id": "improve", "loop": {
        "steps": [
            {"id": "draft", "agent": world.worker,
             "prompt": "round {{loop.iteration}}; before: {{ loop.previous == null ? 'none' : "
                       "loop.previous.review.output }}"},
            {"id": "review", "agent": world.worker, "depends_on": ["draft"],
             "prompt": "review {{ steps.draft.output }}"},
        ],
        "until": "steps.review.output == 'APPROVED'",
        "max_iterations": 3,
    }}])
    trace = world.run(tid, "write")
    events = world.events(trace)
    assert events[-1][1] == "run_finished", events[-1]
    started, finished = by_path(events, "step_started"), by_path(events, "step_finished")
    assert started["improve"]["max_iterations"] == 3
    assert started["improve#1.draft"]["prompt"] == "round 1; before: none"
    assert started["improve#2.draft"]["prompt"] == "round 2; before: needs work"
    assert finished["improve"]["iterations"] == 2 and finished["improve"]["exhausted"] is False
    assert finished["improve"]["output"] == "APPROVED"
    assert finished["improve#1"]["output"] == "needs work"
    assert "improve#3.draft" not in started
    assert events[-1][2]["output"] == "APPROVED"
    rows = {s["path"] for s in world.detail(trace)["steps"]}
    assert rows == {"improve", "improve#1", "improve#1.draft", "improve#1.review",
                    "improve#2", "improve#2.draft", "improve#2.review"}


def test_loop_reaching_max_iterations_is_exhausted_and_output_expression(world):
    tid = world.template([{"id": "l", "loop": {
        "steps": [{"id": "s", "agent": world.worker, "prompt": "try {{loop.iteration}}"}],
        "until": "false", "max_iterations": 2, "output": "loop.iteration * 10",
    }}])
    events = world.events(world.run(tid, "x"))
    assert events[-1][1] == "run_finished", events[-1]
    finished = by_path(events, "step_finished")
    assert finished["l"]["exhausted"] is True and finished["l"]["iterations"] == 2
    assert finished["l"]["output"] == 20
    assert world.prompts() == Counter({"try 1": 1, "try 2": 1})


def test_nesting_three_levels_paths(world):
    tid = world.template([{
        "id": "outer", "foreach": {"items": "input"},
        "steps": [{"id": "improve", "loop": {
            "steps": [{"id": "inner", "foreach": {"items": "[1, 2]"}, "agent": world.worker,
                       "prompt": "{{item}}/{{index}} iteration {{loop.iteration}}"}],
            "until": "true", "max_iterations": 2}}],
    }], **LIST_INPUT)
    events = world.events(world.run(tid, ["a"]))
    assert events[-1][1] == "run_finished", events[-1]
    finished = by_path(events, "step_finished")
    assert "outer[0].improve#1.inner[1]" in finished
    assert finished["outer[0].improve#1.inner[1]"]["output"] == "Echo: 2/1 iteration 1"
    assert finished["outer"]["output"] == [["Echo: 1/0 iteration 1", "Echo: 2/1 iteration 1"]]


def test_foreach_of_human_steps_asks_per_item(world):
    tid = world.template([{"id": "ask", "foreach": {"items": "input", "max_concurrency": 1},
                           "agent": {"human": True}, "prompt": "ok {{item}}?"}], **LIST_INPUT)
    trace = world.run(tid, ["a", "b"])
    answered = 0
    with world.http.stream("GET", f"/workflow/sse/{trace}") as response:
        for _, kind, data in sse_frames(response):
            if kind == "reply_requested":
                assert data["path"] == f"ask[{answered}]" and data["step_id"] == "ask"
                reply = world.http.post(f"/workflow/reply/{trace}", json={
                    "content": f"yes {answered}", "request_id": data["request_id"]})
                assert reply.status_code == 200, reply.text
                answered += 1
            if kind == "run_finished":
                assert data["output"] == ["yes 0", "yes 1"]
    assert answered == 2


def test_save_time_rules(world):
    w = world.worker
    plain = {"agent": w, "prompt": "p"}
    problems = world.refused([{"id": "a", **plain},
                              {"id": "l", "loop": {"steps": [{"id": "a", **plain}],
                                                   "until": "true", "max_iterations": 2}}])
    assert {"field": "steps.1.loop.steps.0.id", "problem": "duplicate step id 'a'"} in problems, problems
    problems = world.refused([{"id": "l", "loop": {"steps": [{"id": "s", **plain}], "until": "true"}}])
    assert any(p["field"].endswith("max_iterations") for p in problems), problems
    for bad in (0, 101):
        world.refused([{"id": "l", "loop": {"steps": [{"id": "s", **plain}], "until": "true",
                                            "max_iterations": bad}}])
    for bad in (0, 65):
        world.refused([{"id": "m", "foreach": {"items": "input", "max_concurrency": bad}, **plain}])
    world.refused([{"id": "m", "foreach": {"items": "input", "on_error": "skip"}, **plain}])
    world.refused([{"id": "m", "foreach": {"items": "input"}, **plain,
                    "steps": [{"id": "s", **plain}]}])  # both agent and steps
    world.refused([{"id": "m", "foreach": {"items": "input ++"}, **plain}])  # does not parse
    world.refused([{"id": "s", "agent": w, "prompt": "{{item}}"}])  # item outside a foreach
    world.refused([{"id": "s", "agent": w, "prompt": "{{loop.iteration}}"}])  # loop outside a loop
    level = {"id": "d4", "foreach": {"items": "[1]"}, **plain}
    for n in (3, 2, 1):
        level = {"id": f"d{n}", "foreach": {"items": "[1]"}, "steps": [level]}
    problems = world.refused([level])
    assert any("three levels" in p["problem"] for p in problems), problems
    world.template([level["steps"][0]])  # three levels are fine


def example(world: World, name: str) -> str:
    """An examples/templates file as examples/README.md uses it (its steps name the worker helper)."""
    import json
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "examples" / "templates" / name).read_text()
    body = json.loads(text)
    made = world.http.post("/workflow/template", json=body)
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


def test_the_two_examples_run_on_the_fake_model(world):
    research = example(world, "research_each_topic.json")
    events = world.events(world.run(research, {"topics": ["owls", "moss", "tides", "bees"]}))
    assert events[-1][1] == "run_finished", events[-1]
    findings = by_path(events, "step_finished")["research"]["output"]
    assert findings == [f"Echo: Research topic {n}: {t}. Answer in two sentences."
                        for n, t in enumerate(["owls", "moss", "tides", "bees"])]
    assert events[-1][2]["output"].startswith("Echo: Summarise these 4 findings")

    review = example(world, "review_until_approved.json")
    trace = world.run(review, "tea")
    answers = iter(["more detail, please", "Approve"])
    with world.http.stream("GET", f"/workflow/sse/{trace}") as response:
        frames = []
        for frame in sse_frames(response):
            frames.append(frame)
            if frame[1] == "reply_requested":
                sent = world.http.post(f"/workflow/reply/{trace}", json={
                    "content": next(answers), "request_id": frame[2]["request_id"]})
                assert sent.status_code == 200, sent.text
    assert frames[-1][1] == "run_finished", frames[-1]
    started, finished = by_path(frames, "step_started"), by_path(frames, "step_finished")
    assert "Feedback on the last draft: more detail, please" in started["improve#2.draft"]["prompt"]
    assert finished["improve"]["iterations"] == 2 and finished["improve"]["exhausted"] is False
    assert frames[-1][2]["output"] == finished["improve#2.draft"]["output"]


def test_a_retried_run_reuses_the_items_that_succeeded(world):
    world.fake.script(
        ScriptedReply(text="first"),
        ScriptedReply(kind="error", status=400, body={"error": {"message": "bad item", "type": "x"}}),
    )
    tid = world.template([{"id": "m", "foreach": {"items": "input", "max_concurrency": 1},
                           "agent": world.worker, "prompt": "{{item}}"}], **LIST_INPUT)
    failed = world.run(tid, ["x", "y", "z"])
    assert world.events(failed)[-1][1] == "run_failed"
    retried = world.http.post(f"/workflow/run/{failed}/retry")
    assert retried.status_code == 202, retried.text
    trace = retried.json()["trace_id"]
    events = world.events(trace)
    assert events[-1][1] == "run_finished", events[-1]
    assert events[-1][2]["output"] == ["first", "Echo: y", "Echo: z"]
    assert world.prompts() == Counter({"x": 1, "y": 2, "z": 1})  # x is reused, never called again
    assert "m[0]" not in by_path(events, "step_started")
    rows = {s["path"]: s for s in world.detail(trace)["steps"]}
    assert rows["m[0]"]["reused"] is True and rows["m[0]"]["output"] == "first"
    assert rows["m[1]"]["reused"] is False and rows["m"]["reused"] is False
