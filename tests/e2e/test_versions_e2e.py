"""SPEC §13 against a real `orchestra serve` and the fake model counting its calls:
forks re-pay only what they must, pinned runs run their version, diff and restore
round-trip. Every agent prompt starts with its step id, so the model's requests say
exactly which steps were called."""

from __future__ import annotations

import random
import time

import pytest

from orchestra.testing.fake_llm import FakeLLM
from tests.conftest import ServerProcess
from tests.e2e.test_loops_e2e import World


@pytest.fixture
def world(tmp_path):
    with FakeLLM() as fake:
        server = ServerProcess(tmp_path / "home").start()
        try:
            yield World(server, fake)
        finally:
            server.stop()


def finished(world: World, trace_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = world.detail(trace_id)
        if run["status"] in ("succeeded", "failed", "cancelled", "interrupted"):
            assert run["status"] == "succeeded", run.get("error")
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {trace_id} did not end")


def called(world: World, since: int) -> list[str]:
    """The step ids whose prompts reached the model since request `since`."""
    return sorted(body["messages"][-1]["content"].split(":", 1)[0]
                  for body in world.fake.chat_requests[since:])


def fork(world: World, trace_id: str, **body) -> dict:
    answer = world.http.post(f"/workflow/run/{trace_id}/fork", json=body)
    assert answer.status_code == 202, answer.text
    return finished(world, answer.json()["trace_id"])


def agent(world: World, sid: str, prompt: str, depends_on=()) -> dict:
    return {"id": sid, "agent": world.worker, "prompt": f"{sid}: {prompt}", "depends_on": list(depends_on)}


def test_a_50_step_run_forked_at_step_40_calls_the_provider_for_10_steps(world):
    steps = [agent(world, "s1", "{{input}}")]
    steps += [agent(world, f"s{n}", f"after {{{{steps.s{n - 1}.output}}}}", [f"s{n - 1}"]) for n in range(2, 51)]
    source = finished(world, world.run(world.template(steps), "go"))
    assert len(world.fake.chat_requests) == 50
    since = len(world.fake.chat_requests)
    run = fork(world, source["trace_id"], from_step="s41")
    assert called(world, since) == sorted(f"s{n}" for n in range(41, 51))
    assert run["forked_from"] == {"trace_id": source["trace_id"], "from_step": "s41"}
    assert sum(s["reused"] for s in run["steps"]) == 40
    events = world.events(run["trace_id"])
    reused = [data for _, kind, data in events if kind == "step_reused"]
    assert sorted(d["step_id"] for d in reused) == sorted(f"s{n}" for n in range(1, 41))
    assert {d["source_trace_id"] for d in reused} == {source["trace_id"]}
    assert not [d for _, kind, d in events if kind == "step_started" and int(d["step_id"][1:]) <= 40]

    since = len(world.fake.chat_requests)  # a fixed answer of step 40 instead
    run = fork(world, source["trace_id"], outputs={"s40": "a better answer"})
    assert called(world, since) == sorted(f"s{n}" for n in range(41, 51))
    s41 = next(s for s in run["steps"] if s["step_id"] == "s41")
    assert s41["output"] == "Echo: s41: after a better answer"


def _random_template(world: World, rng: random.Random, size: int) -> tuple[list[dict], dict[str, set[str]]]:
    """Steps reading `input.a`, `input.b`, both or neither, and random earlier steps;
    and what each reads (`a`, `b`, and step ids)."""
    steps, reads = [], {}
    for n in range(size):
        sid = f"r{n}"
        parts = [name for name in ("a", "b") if rng.random() < 0.25]
        earlier = rng.sample([s["id"] for s in steps], k=min(len(steps), rng.choice([0, 1, 1, 2])))
        prompt = " ".join([*(f"{{{{ input.{p} }}}}" for p in parts),
                           *(f"{{{{steps.{e}.output}}}}" for e in earlier)]) or "plain"
        steps.append(agent(world, sid, prompt, earlier))
        reads[sid] = set(parts) | set(earlier)
    return steps, reads


def _reaches(reads: dict[str, set[str]], changed: str) -> set[str]:
    """The steps that read `changed`, directly or through other steps."""
    found: set[str] = set()
    for sid, what in reads.items():  # steps are listed after what they read
        if changed in what or what & found:
            found.add(sid)
    return found


SCHEMA = {"input_schema": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}}


def test_a_changed_input_reruns_exactly_the_steps_that_read_it(world):
    rng = random.Random(20261126)
    schema = SCHEMA
    for _ in range(4):
        steps, reads = _random_template(world, rng, 14)
        source = finished(world, world.run(world.template(steps, **schema), {"a": "one", "b": "two"}))
        since = len(world.fake.chat_requests)
        run = fork(world, source["trace_id"], input={"a": "one", "b": "TWO"})
        expected = _reaches(reads, "b")
        assert called(world, since) == sorted(expected), reads
        assert {s["step_id"] for s in run["steps"] if s["reused"]} == set(reads) - expected


def test_an_override_on_one_branch_reruns_that_branch_and_none_of_the_100_items(world):
    steps = [{"id": "each", "foreach": {"items": "input", "max_concurrency": 16}, "agent": world.worker,
              "prompt": "each: {{item}}"},
             agent(world, "b1", "first"),
             agent(world, "b2", "{{steps.b1.output}}", ["b1"]),
             agent(world, "b3", "{{steps.b2.output}}", ["b2"]),
             agent(world, "summary", "{{steps.each.output}}", ["each"])]
    items = [f"item {n}" for n in range(100)]
    source = finished(world, world.run(world.template(steps, input_schema={"type": "array"}), items))
    assert len(world.fake.chat_requests) == 104
    since = len(world.fake.chat_requests)
    run = fork(world, source["trace_id"], outputs={"b1": "changed"})
    assert called(world, since) == ["b2", "b3"]
    paths = {s["path"]: s for s in run["steps"]}
    assert all(paths[f"each[{n}]"]["reused"] for n in range(100)) and paths["summary"]["reused"]
    assert paths["b1"]["output"] == "changed" and paths["b3"]["output"] == "Echo: b3: Echo: b2: changed"


def test_a_map_over_a_list_that_a_rerun_step_answers_reuses_its_unchanged_items(world):
    """The list is known only once `plan` ran again: each item is decided when the map
    evaluates it (engine/reuse.py); then a changed worker runs every step of it again."""
    listing = {"type": "array", "items": {"type": "string"}}
    plan = {**agent(world, "plan", "{{ input.v }} fake:value={{ input.items }}"), "output_schema": listing}
    steps = [plan, {"id": "each", "foreach": {"items": "steps.plan.output", "max_concurrency": 8},
                    "agent": world.worker, "prompt": "each: {{ item }}", "depends_on": ["plan"]},
             agent(world, "summary", "{{ steps.each.output }}", ["each"])]
    items = [f"item {n}" for n in range(20)]
    schema = {"input_schema": {"type": "object", "properties": {"v": {"type": "integer"}, "items": listing}}}
    source = finished(world, world.run(world.template(steps, **schema), {"v": 1, "items": items}))
    assert len(world.fake.chat_requests) == 22
    since = len(world.fake.chat_requests)
    changed = [*items[:7], "changed", *items[8:]]
    run = fork(world, source["trace_id"], input={"v": 2, "items": changed})
    assert called(world, since) == ["each", "plan", "summary"]
    assert "each: changed" in [b["messages"][-1]["content"] for b in world.fake.chat_requests[since:]]
    paths = {s["path"]: s for s in run["steps"]}
    assert [n for n in range(20) if not paths[f"each[{n}]"]["reused"]] == [7]
    assert paths["each[3]"]["output"] == "Echo: each: item 3" and paths["each[7]"]["output"] == "Echo: each: changed"
    events = world.events(run["trace_id"])
    reused = {d["path"] for _, kind, d in events if kind == "step_reused"}
    assert reused == {f"each[{n}]" for n in range(20) if n != 7}
    assert not reused & {d["path"] for _, kind, d in events if kind == "step_started"}

    worker = world.worker["worker"]
    edited = world.http.put(f"/agent/worker/{worker}", json={"system_prompt": "Answer in French."})
    assert edited.status_code == 200, edited.text
    since = len(world.fake.chat_requests)
    run = fork(world, source["trace_id"])
    assert len(world.fake.chat_requests) - since == 22
    assert not any(s["reused"] for s in run["steps"])


def _mutate(world: World, rng: random.Random, steps: list[dict]) -> tuple[list[dict], dict]:
    """A copy of `steps` with random changes, and the diff they make."""
    new = [dict(s) for s in steps]
    expected = {"added": [], "removed": [], "changed": {}}
    for step in new[1:]:
        roll = rng.random() if "prompt" in step else 1.0
        if roll < 0.2:
            step["prompt"] += " (edited)"
            expected["changed"][step["id"]] = ["prompt"]
        elif roll < 0.3:
            step["timeout_seconds"] = rng.randint(1, 100)
            expected["changed"][step["id"]] = ["timeout_seconds"]
    if rng.random() < 0.7:  # drop the last step (nothing depends on it)
        gone = new.pop()
        expected["removed"] += [gone["id"], *(inner["id"] for inner in (gone.get("loop") or {}).get("steps", []))]
        expected["changed"].pop(gone["id"], None)
    for n in range(rng.randint(0, 2)):
        sid = f"new{len(new)}x{n}"
        new.append(agent(world, sid, "added"))
        expected["added"].append(sid)
    return new, expected


def test_diff_then_restore_round_trips_on_random_template_pairs(world):
    rng = random.Random(7)
    for round_ in range(5):
        old, _ = _random_template(world, rng, rng.randint(3, 8))
        loop = {"id": "lp", "loop": {"steps": [agent(world, "inner", "x")], "until": "true", "max_iterations": 2}}
        old.append(loop)
        new, expected = _mutate(world, rng, old)
        if rng.random() < 0.5 and any(s["id"] == "lp" for s in new):  # an inner step alone changes
            index = next(i for i, s in enumerate(new) if s["id"] == "lp")
            new[index] = {"id": "lp", "loop": {**loop["loop"], "steps": [agent(world, "inner", "y")]}}
            expected["changed"]["inner"] = ["prompt"]
            expected["changed"].pop("lp", None)
        tid = world.template(old, **SCHEMA)
        updated = world.http.put(f"/workflow/template/{tid}", json={"name": f"renamed{round_}", "steps": new,
                                                                   **SCHEMA})
        assert updated.status_code == 200, updated.text
        diff = world.http.get(f"/workflow/template/{tid}/diff", params={"from": 1, "to": 2}).json()
        assert diff["added"] == expected["added"] and diff["removed"] == expected["removed"]
        assert {c["step_id"]: c["fields"] for c in diff["changed"]} == expected["changed"]
        assert diff["template_fields"] == ["name"]
        restored = world.http.post(f"/workflow/template/{tid}/versions/1/restore")
        assert restored.status_code == 201 and restored.json()["version"] == 3
        back = world.http.get(f"/workflow/template/{tid}/diff", params={"from": 1, "to": 3}).json()
        assert back["added"] == back["removed"] == back["changed"] == back["template_fields"] == []
        first = world.http.get(f"/workflow/template/{tid}/versions/1").json()["version"]
        assert world.http.get(f"/workflow/template/{tid}").json()["template"]["steps"] == first["steps"]
        undo = world.http.get(f"/workflow/template/{tid}/diff", params={"from": 2, "to": 3}).json()
        assert undo["added"] == expected["removed"] and undo["removed"] == expected["added"]


def test_a_run_of_version_3_after_version_5_exists_runs_version_3(world):
    tid = world.template([agent(world, "only", "version 1 {{input}}")])
    for n in range(2, 6):
        body = {"name": "t", "steps": [agent(world, "only", f"version {n} {{{{input}}}}"),
                                       *([agent(world, "extra", f"v{n} extra")] if n == 3 else [])]}
        assert world.http.put(f"/workflow/template/{tid}", json=body).status_code == 200
    listed = world.http.get(f"/workflow/template/{tid}/versions").json()["versions"]
    assert [v["version"] for v in listed] == [5, 4, 3, 2, 1]
    since = len(world.fake.chat_requests)
    started = world.http.post("/workflow/run", json={"template_id": tid, "input": "x", "version": 3})
    assert started.status_code == 202, started.text
    run = finished(world, started.json()["trace_id"])
    prompts = sorted(body["messages"][-1]["content"] for body in world.fake.chat_requests[since:])
    assert prompts == ["extra: v3 extra", "only: version 3 x"]
    assert run["template_version"] == 3 and [s["step_id"] for s in run["steps"]] == ["only", "extra"]
    assert world.http.get(f"/workflow/run/{run['trace_id']}").json()["template_version"] == 3


def test_saves_racing_on_two_processes_on_postgresql_get_consecutive_numbers(pair):
    """Twenty saves of one template, half through each of two servers on one PostgreSQL
    database, all at once: versions 2…21, no gap, no duplicate; refused saves make none."""
    from concurrent.futures import ThreadPoolExecutor

    human = {"agent": {"human": True}, "depends_on": []}
    made = pair.http_a.post("/workflow/template", json={"name": "raced", "steps": [{"id": "q", "prompt": "p0", **human}]})
    assert made.status_code == 201, made.text
    tid = made.json()["template_id"]

    def save(n: int) -> int:
        http = pair.client(pair.a if n % 2 else pair.b)
        steps = [{"id": "q", "prompt": f"p{n}", **human}] if n <= 20 else [{"id": "q", "prompt": "{{steps.x.output}}", **human}]
        answer = http.put(f"/workflow/template/{tid}", json={"name": "raced", "steps": steps})
        return answer.json()["template"]["version"] if answer.status_code == 200 else -answer.status_code

    with ThreadPoolExecutor(max_workers=24) as pool:
        numbers = sorted(pool.map(save, range(1, 25)))
    assert numbers == [-422] * 4 + list(range(2, 22))
    listed = pair.http_b.get(f"/workflow/template/{tid}/versions").json()["versions"]
    assert [v["version"] for v in listed] == list(range(21, 0, -1))
    latest = pair.http_a.get(f"/workflow/template/{tid}").json()["template"]
    newest = pair.http_b.get(f"/workflow/template/{tid}/versions/21").json()["version"]
    assert latest["version"] == 21 and latest["steps"] == newest["steps"]
