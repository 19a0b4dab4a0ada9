"""Spans, received in memory: a request's, its run's, the steps', the model calls' and
the tool calls', all in the trace of the `traceparent` the client sent."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestra.db.models import WorkflowRun
from orchestra.observability import tracing
from tests.web.test_workflow_routes import API, human, make_template, wait_for

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.shutdown()
    assert tracing.setup(exporter, simple=True)
    yield exporter
    tracing.shutdown()


def hexid(number: int, width: int) -> str:
    return format(number, f"0{width}x")


async def test_a_run_is_traced_under_the_clients_traceparent(spans, client, users, fake_llm):
    from orchestra.services import agents, providers

    alice = await users.make("alice")
    core = client.app.ctx.core
    provider = await providers.create_provider(
        core, name="fake", kind="openai_compatible", model_id="fake-model", api_key="k",
        base_url=fake_llm.base_url)
    worker = await agents.create_worker(core, owner_id=alice["user_id"], name="w",
                                        provider_id=provider.id, tools=["calculator"])
    steps = [{"id": "calc", "agent": {"worker": worker.id}, "prompt": "Compute {{input}}"},
             human("ask", "Fine?", depends_on=["calc"])]
    template = (await make_template(client, alice, steps))["template_id"]
    fake_llm.script_tool_call("calculator", {"expression": "6*7"})
    fake_llm.script_text("42")
    started = await client.post(f"{API}/run", json={"template_id": template, "input": "6*7"},
                                headers={**alice["headers"],
                                         "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert started.status_code == 202
    trace_id = started.json()["trace_id"]
    await wait_for(client, alice, trace_id, "waiting_reply")
    stored = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert stored.trace_parent.startswith(f"00-{CLIENT_TRACE}-")
    reply = await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"], json={"content": "ok"})
    assert reply.status_code == 200
    await wait_for(client, alice, trace_id, "succeeded")
    tracing.flush()

    finished = spans.get_finished_spans()
    mine = [s for s in finished if hexid(s.context.trace_id, 32) == CLIENT_TRACE]
    by_name: dict[str, list] = {}
    for span in mine:
        by_name.setdefault(span.name, []).append(span)
    (start,) = by_name["POST /api/v1/workflow/run"]
    assert hexid(start.parent.span_id, 16) == CLIENT_SPAN
    assert start.attributes["http.route"] == "/api/v1/workflow/run"
    assert stored.trace_parent.startswith(f"00-{CLIENT_TRACE}-{hexid(start.context.span_id, 16)}-")
    (run,) = by_name["run"]
    assert run.parent.span_id == start.context.span_id
    assert run.attributes["orchestra.trace_id"] == trace_id
    assert run.attributes["orchestra.outcome"] == "succeeded"
    (calc,) = by_name["step calc"]
    (ask,) = by_name["step ask"]
    assert calc.parent.span_id == run.context.span_id and ask.parent.span_id == run.context.span_id
    llm_calls = by_name["llm openai_compatible"]
    assert len(llm_calls) == 2 and {s.parent.span_id for s in llm_calls} == {calc.context.span_id}
    assert all(s.attributes["gen_ai.request.model"] == "fake-model" for s in llm_calls)
    (tool,) = by_name["tool calculator"]
    assert tool.parent.span_id == calc.context.span_id
    # Other requests (the reply, the status reads) are traces of their own.
    others = [s for s in finished if s.name.startswith("GET /api/v1/workflow/run/")]
    assert others and all(hexid(s.context.trace_id, 32) != CLIENT_TRACE for s in others)
    assert all(s.attributes["http.route"] == "/api/v1/workflow/run/{trace_id}" for s in others)


async def test_a_malformed_traceparent_starts_a_new_trace(spans, client, users):
    alice = await users.make("alice")
    template = (await make_template(client, alice, [human()]))["template_id"]
    started = await client.post(f"{API}/run", json={"template_id": template},
                                headers={**alice["headers"], "traceparent": "00-zz-nope-01"})
    assert started.status_code == 202
    stored = await WorkflowRun.aget(WorkflowRun.trace_id == started.json()["trace_id"])
    (start,) = [s for s in spans.get_finished_spans() if s.name == "POST /api/v1/workflow/run"]
    assert start.parent is None
    assert stored.trace_parent.startswith(f"00-{hexid(start.context.trace_id, 32)}-{hexid(start.context.span_id, 16)}-")


def test_without_tracing_a_wellformed_traceparent_is_still_kept_for_the_run():
    tracing.shutdown()
    good = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    assert tracing.parent_for_run({"traceparent": good.upper()}) == good
    assert tracing.parent_for_run({"traceparent": "00-" + "0" * 32 + f"-{CLIENT_SPAN}-01"}) is None
    assert tracing.parent_for_run({"traceparent": "garbage"}) is None
    assert tracing.parent_for_run({}) is None
