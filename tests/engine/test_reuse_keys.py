"""Reuse keys (engine/reuse.py) and what a fork runs again whatever it reads
(services/fork_plan.run_again): pure functions, the rules docs/api.md states."""

from __future__ import annotations

import dataclasses

from orchestra.engine.model import step_defs
from orchestra.engine.reuse import agent_fingerprint, call_key
from orchestra.services.agent_cache import AgentConfig
from orchestra.services.fork_plan import run_again

CONFIG = AgentConfig(kind="worker", id="w1", owner_id="o", name="writer", system_prompt="Be brief.",
                     skill_instructions=None, tools=("calculator",), provider_id="p1",
                     provider_kind="openai_compatible", provider_base_url="http://127.0.0.1:1/v1",
                     provider_api_key="k1", model="m1", provider_name="fake", provider_prices={"input": 1})


def key(step: dict, prompt: str = "hello", config: AgentConfig | None = CONFIG, files=None) -> str:
    return call_key(step_defs([step])[0], prompt, files, None if config is None else agent_fingerprint(config))


STEP = {"id": "s", "agent": {"worker": "w1"}, "prompt": "{{ input }}"}


def test_a_key_changes_with_what_the_call_runs_with_and_only_that():
    base = key(STEP)
    assert key(dict(STEP)) == base and key(STEP, config=dataclasses.replace(CONFIG)) == base
    for change in ({"system_prompt": "Be long."}, {"model": "m2"}, {"tools": ()}, {"provider_id": "p2"},
                   {"provider_base_url": "http://127.0.0.1:2/v1"}, {"provider_kind": "anthropic"},
                   {"skill_instructions": "Cite."}):
        assert key(STEP, config=dataclasses.replace(CONFIG, **change)) != base, change
    for same in ({"provider_api_key": "rotated"}, {"name": "renamed"}, {"provider_name": "other"},
                 {"provider_prices": {"input": 2}}, {"provider_limits": {"rpm": 1}}):
        assert key(STEP, config=dataclasses.replace(CONFIG, **same)) == base, same
    assert key(STEP, prompt="hello!") != base
    assert key(STEP, files=[{"file_id": "f1", "filename": "a.txt"}]) != base
    assert key({**STEP, "timeout_seconds": 5}) != base  # the definition changed
    human = {"id": "s", "agent": {"human": True}, "prompt": "{{ input }}"}
    assert key(human, config=None) != base


def test_an_item_key_ignores_the_map_settings_but_not_its_call():
    each = {"id": "each", "foreach": {"items": "input", "max_concurrency": 2}, "agent": {"worker": "w1"},
            "prompt": "{{ item }}"}
    base = key(each)
    assert key({**each, "foreach": {"items": "input.list", "max_concurrency": 8}}) == base
    assert key({**each, "depends_on": ["plan"], "when": "true"}) == base
    assert key({**each, "prompt": "{{ item }}!"}) != base
    assert key({**each, "output_schema": {"type": "string"}}) != base


def test_run_again_follows_what_reads_the_step_at_every_level():
    steps = [
        {"id": "plan", "agent": {"worker": "w"}, "prompt": "p"},
        {"id": "free", "agent": {"worker": "w"}, "prompt": "{{ input }}"},
        {"id": "each", "foreach": {"items": "steps.plan.output"}, "depends_on": ["plan"],
         "steps": [{"id": "fetch", "agent": {"worker": "w"}, "prompt": "{{ item }}"}]},
        {"id": "lp", "loop": {"until": "true", "max_iterations": 2, "steps": [
            {"id": "draft", "agent": {"worker": "w"}, "prompt": "{{ steps.free.output }}"},
            {"id": "note", "agent": {"worker": "w"}, "prompt": "n"}]}},
        {"id": "last", "agent": {"worker": "w"}, "prompt": "{{ steps.lp.output }}", "depends_on": ["lp"]},
    ]
    assert run_again(steps, None) == set()
    # a map reading `plan` runs again with all inside it (its items are plan's answer)
    assert run_again(steps, "plan") == {"plan", "each", "fetch"}
    # an inner step of a loop: its whole body (loop.previous), the loop, and what reads it
    assert run_again(steps, "draft") == {"draft", "note", "lp", "last"}
    assert run_again(steps, "free") == {"free", "draft", "note", "lp", "last"}
    # an inner step of a map: its container and readers, not its siblings' other items
    assert run_again(steps, "fetch") == {"fetch", "each"}
