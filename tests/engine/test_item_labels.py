"""A foreach item's `step_started` names the item by its value (`item`), whatever its items
expression (issue 39: the console named items "item 0…2" when `items` was not a plain path
it could follow itself) — for one agent per item and for a small workflow per item."""

from __future__ import annotations

from orchestra.engine.instances import LABEL_MAX, item_label
from tests.engine.test_engine import events, setup_agent, wait_status, worker_step
from tests.engine.test_language_runs import start


def test_an_items_label_is_a_short_text_of_its_value():
    assert item_label("tea") == "tea"
    assert item_label({"topic": "coffee", "origin": "Ethiopia"}) == "coffee"
    assert item_label({"score": 3, "text": "  green\n  tea "}) == "green tea"  # its first text, blanks collapsed
    assert item_label({"id": 7}) == "7" and item_label(3) == "3" and item_label([1, "a"]) == '[1,"a"]'
    assert item_label(None) == ""
    long = item_label("a rather long topic " * 4)
    assert len(long) == LABEL_MAX and long.endswith("…") and long.startswith("a rather long topic")


async def test_items_of_a_computed_list_carry_their_labels(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    per_item = {**worker_step(who, "each", "About {{ item.name }}"),
                "foreach": {"items": "input.topics.filter(t, t.name != 'skip')"}}
    workflow = {"id": "deep", "foreach": {"items": "input.topics.map(t, t.name + ' tea')"},
                "steps": [worker_step(who, "look", "About {{ item }}")], "depends_on": ["each"]}
    trace_id = await start(core, who, [per_item, workflow], input={"topics": [
        {"name": "green"}, {"name": "skip"}, {"name": "oolong"}]},
        input_schema={"type": "object"})
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded", run.error
    started = {e.data["path"]: e.data for e in await events(core, trace_id) if e.kind == "step_started"}
    assert started["each[0]"]["item"] == "green" and started["each[1]"]["item"] == "oolong"
    assert [started[f"deep[{i}]"]["item"] for i in range(3)] == ["green tea", "skip tea", "oolong tea"]
    assert started["deep[0]"]["index"] == 0
    assert "item" not in started["each"] and "item" not in started["deep[0].look"]  # items only
