"""A foreach that cannot map its items (too many, not a list) fails as a step does: its
row `failed` with the error and a `step_failed` event (issue 24: it failed the run and
left the step with no failed state and no event)."""

from __future__ import annotations

import pytest

from tests.engine.test_engine import events, setup_agent, steps_of, wait_status, worker_step
from tests.engine.test_language_runs import start


@pytest.fixture
def settings_overrides():
    return {"foreach_max_items": 3}


@pytest.mark.parametrize(("items", "problem"), [
    ("[1, 2, 3, 4]", "gave 4 items; at most 3 may be mapped (ORCHESTRA_FOREACH_MAX_ITEMS)"),
    ("'one'", "gave a str, not a list"),
])
async def test_a_foreach_that_cannot_map_fails_its_step(core, fake_llm, items, problem):
    who = await setup_agent(core, fake_llm)
    step = {**worker_step(who, "each", "Look at {{item}}"), "foreach": {"items": items}}
    trace_id = await start(core, who, [step])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "failed" and problem in run.error
    row = (await steps_of(core, trace_id))["each"]
    assert row.status == "failed" and problem in row.error
    failed = [e for e in await events(core, trace_id) if e.kind == "step_failed"]
    assert len(failed) == 1 and problem in failed[0].data["error"]
    assert fake_llm.chat_requests == []
