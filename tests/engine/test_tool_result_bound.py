"""A tool's result is stored (`tool_result`) and sent to the model: past the step output
bound (UTF-8 bytes) it is neither; the model reads an error naming the bound."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from orchestra.db.models import Worker
from orchestra.engine.tools import Tool, ToolContext, default_registry
from orchestra.services import agents
from tests.engine.test_engine import events, setup_agent, start, wait_status, worker_step

LIMIT = 1000


@pytest.fixture
def settings_overrides():
    return {"step_output_max_bytes": LIMIT}


class _Repeat(Tool):
    """Returns `text` repeated `times` times: a tool whose result the model sizes."""

    name = "repeat"
    description = "Repeats a text."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return args["text"] * args["times"]


async def test_a_tool_result_past_the_output_bound_is_not_stored(core, fake_llm):
    registry = default_registry()
    registry.register(_Repeat())
    core.extras["tool_registry"] = registry
    who = await setup_agent(core, fake_llm, tools=("calculator",))
    await core.db.aexecute(Worker.update(tools=["repeat"]).where(Worker.id == who["worker_id"]))
    agents.agent_cache(core).invalidate()
    fake_llm.script_tool_call("repeat", {"text": "ü", "times": 600})  # 600 characters, 1,200 bytes
    fake_llm.script_tool_call("repeat", {"text": "ü", "times": 400})  # 800 bytes: fits
    fake_llm.script_text("done")
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded", run.error
    big, small = [e.data for e in await events(core, trace_id) if e.kind == "tool_result"]
    assert big["result"] is None and f"limit of {LIMIT} bytes" in big["error"]
    assert "1200 bytes" in big["error"] and "ORCHESTRA_STEP_OUTPUT_MAX_BYTES" in big["error"]
    assert small["result"] == "ü" * 400 and "error" not in small
    told = fake_llm.chat_requests[1]["messages"][-1]["content"]
    assert "ORCHESTRA_STEP_OUTPUT_MAX_BYTES" in told and "ü" not in told
