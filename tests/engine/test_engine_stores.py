"""A run's ordered background writes on both stores: every event once, in order, each
step's rows and events consistent, the last token stored with `step_finished`."""

from __future__ import annotations

import pytest

from orchestra.db.models import RunEvent, RunStep, WorkflowRun
from tests.engine.test_engine import setup_agent, start
from tests.fakes.fake_llm import FakeLLM, fake_llm  # noqa: F401 - fixture


@pytest.fixture
def database_url(both_stores):
    return both_stores


async def test_a_run_stores_every_event_once_in_order_with_its_step_rows(core, fake_llm: FakeLLM):
    who = await setup_agent(core, fake_llm)
    core.engine.token_interval = 5.0  # no timer flush: a step's text is one token event
    fake_llm.script_text("alpha beta gamma", chunks=3)
    fake_llm.script_tool_call("calculator", {"expression": "6*7"})
    fake_llm.script_text("It is 42.")
    fake_llm.script_text("left")
    fake_llm.script_text("right")
    wid = who["worker_id"]
    steps = [
        {"id": "a", "agent": {"worker": wid}, "prompt": "{{input}}"},
        {"id": "b", "agent": {"worker": wid}, "prompt": "{{steps.a.output}}", "depends_on": ["a"]},
        {"id": "c", "agent": {"worker": wid}, "prompt": "c", "depends_on": ["b"]},
        {"id": "d", "agent": {"worker": wid}, "prompt": "d", "depends_on": ["b"]},
    ]
    trace_id = await start(core, who, steps)
    await core.engine.runs[trace_id].task  # the run ends only once its writes are stored

    run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert run.status == "succeeded"
    rows = await core.db.list(RunStep.select().where(RunStep.run == trace_id).order_by(RunStep.step_id))
    assert [(r.step_id, r.status) for r in rows] == [(s, "succeeded") for s in "abcd"]
    assert rows[0].output == "alpha beta gamma" and rows[1].output == "It is 42."
    assert all(r.started_at is not None and r.finished_at >= r.started_at for r in rows)

    stored = await core.db.list(RunEvent.select().where(RunEvent.run == trace_id).order_by(RunEvent.seq))
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert [e.data["seq"] for e in stored] == [e.seq for e in stored]
    assert stored[0].kind == "run_started" and stored[-1].kind == "run_finished"
    for sid in "abcd":
        kinds = [e.kind for e in stored if e.data.get("step_id") == sid]
        assert kinds[0] == "step_started" and kinds[-1] == "step_finished", (sid, kinds)
    text_a = "".join(e.data["text"] for e in stored if e.kind == "token" and e.data["step_id"] == "a")
    assert text_a == "alpha beta gamma"
    b_kinds = [e.kind for e in stored if e.data.get("step_id") == "b"]
    assert b_kinds.index("tool_call") < b_kinds.index("tool_result") < b_kinds.index("step_finished")
    finished_a = next(e for e in stored if e.kind == "step_finished" and e.data["step_id"] == "a")
    last_token_a = stored[finished_a.seq - 2]
    assert last_token_a.kind == "token" and last_token_a.data["ts"] == finished_a.data["ts"]  # one INSERT
