"""`ORCHESTRA_LOG_FORMAT`: JSON lines that parse, with the request and run ids of the
task that logged them; text lines name them too."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from orchestra.observability import context, logs
from orchestra.settings import Settings


@pytest.fixture
def captured():
    stream = io.StringIO()
    yield stream
    orchestra = logging.getLogger("orchestra")
    for handler in list(orchestra.handlers):
        if getattr(handler, "_orchestra", False):
            orchestra.removeHandler(handler)
    orchestra.propagate = True


async def test_json_lines_parse_and_name_the_request_and_the_run(captured):
    logs.configure("json", stream=captured)
    log = logging.getLogger("orchestra.engine")

    async def a_request():
        context.request_id.set("req-1")
        log.info("answered %s", "GET /x")

    async def a_run():
        context.bind_run("run-7")
        log.warning("run %s is slow", "run-7")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("run crashed")

    await asyncio.gather(asyncio.create_task(a_request()), asyncio.create_task(a_run()))
    log.info('quote " and newline \n inside')
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert len(lines) == 4
    for line in lines:
        assert set(line) >= {"ts", "level", "msg", "logger"}
        assert line["ts"].endswith("+00:00") and line["logger"] == "orchestra.engine"
    first, slow, crashed, plain = lines
    assert first == {**first, "level": "INFO", "msg": "answered GET /x", "request_id": "req-1"}
    assert "trace_id" not in first
    assert slow["trace_id"] == "run-7" and "request_id" not in slow and slow["level"] == "WARNING"
    assert crashed["trace_id"] == "run-7" and "RuntimeError: boom" in crashed["exc"]
    assert plain["msg"] == 'quote " and newline \n inside'
    assert "request_id" not in plain and "trace_id" not in plain


async def test_text_lines_name_the_ids(captured):
    logs.configure("text", stream=captured)
    context.request_id.set("req-2")
    context.run_id.set("run-8")
    try:
        logging.getLogger("orchestra.web").info("hello")
    finally:
        context.request_id.set(None)
        context.run_id.set(None)
    line = captured.getvalue().strip()
    assert line.endswith("INFO orchestra.web [request_id=req-2 trace_id=run-8]: hello")


def test_the_setting_refuses_an_unknown_format():
    with pytest.raises(ValueError, match="ORCHESTRA_LOG_FORMAT"):
        Settings.from_env(env={"ORCHESTRA_LOG_FORMAT": "xml"})
    assert Settings.from_env(env={"ORCHESTRA_LOG_FORMAT": "json"}).log_format == "json"
