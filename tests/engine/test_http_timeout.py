"""An HTTP step's `timeout_seconds` bounds the whole exchange (SPEC §15b): connect,
send and every read, not each read. Against a real loopback server that sends its
answer one byte at a time, each byte well within the timeout, the whole far past it."""

from __future__ import annotations

import time

import pytest

from orchestra.db.models import RunStep
from orchestra.services import auth
from orchestra.testing.fake_http import FakeHttp
from tests.engine.test_engine import start, wait_status


@pytest.fixture(scope="module")
def target():
    with FakeHttp() as server:
        yield server


@pytest.fixture
def settings_overrides(target):
    return {"step_egress_allow": f"127.0.0.1:{target.port}"}


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


async def test_a_server_dripping_bytes_cannot_stretch_the_timeout(core, target):
    user = await auth.register(core, user_name="alice", password="password-123")
    # 40 bytes, one every 0.25 s: each read waits 0.25 s (< 1 s), the whole takes 10 s
    began = time.monotonic()
    trace_id = await start(core, {"user_id": user.id}, [
        {"id": "drip", "on_error": "continue",
         "http": {"method": "GET", "url": target.url + "/drip/40?every=0.25", "timeout_seconds": 1}},
        {"id": "quick", "depends_on": ["drip"],
         "http": {"method": "GET", "url": target.url + "/drip/2?every=0.05", "timeout_seconds": 1}},
    ])
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=20)
    took = time.monotonic() - began
    rows = {r.step_id: r for r in await core.db.list(RunStep.select().where(RunStep.run == trace_id))}
    assert rows["drip"].status == "failed", rows["drip"].output_value
    assert "no whole answer within 1 s (timeout_seconds)" in rows["drip"].error
    assert rows["quick"].status == "succeeded" and rows["quick"].output_value["body"] == "xx"
    assert run.status == "succeeded", run.error
    assert took < 5, f"the run took {took:.1f} s: the step's timeout was stretched by the drip"
