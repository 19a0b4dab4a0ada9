"""Composition against real `orchestra serve` processes (SPEC §14).

- A parent/child/grandchild chain on two processes sharing PostgreSQL, the owner killed
  (SIGKILL) while the grandchild's step is in flight: the other process takes every
  level over and the parent finishes; no finished step is called again and no child is
  started twice.
- Cancelling the parent through the other process cancels every descendant within 2 s.
- A secret sent in an HTTP header (and URL) never appears in any event, output, run
  detail, log line, trace span, metrics page or error.
- Every refused address class fails the step naming the rule and the setting.
- A child template deleted while its parent waits fails that step (its child is
  cancelled); an answer over 1 MiB without a Content-Length fails its step.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import httpx
import pytest

from orchestra.testing.fake_http import FakeHttp
from orchestra.testing.fake_llm import ScriptedReply
from tests.conftest import ServerProcess
from tests.e2e.test_scale_out import stored, wait_for
from tests.e2e.test_workflow_e2e import login, sse_frames
from tests.observability.otlp_receiver import OTLPReceiver

SECRET = "sk-e2e-1f2e3d4c5b6a79880011"


def prompts(fake) -> Counter:
    return Counter(body["messages"][-1]["content"] for body in fake.chat_requests)


def chain(pair, worker: str) -> str:
    """grand: g1 -> g2; child: c0 -> (grand); top: p0 -> (child) -> p2. The top's id."""
    http = pair.http_a
    agent = {"worker": worker}
    pair.template(http, [
        {"id": "g1", "agent": agent, "prompt": "g1 {{input}}"},
        {"id": "g2", "agent": agent, "prompt": "g2 {{steps.g1.output}}", "depends_on": ["g1"]}], name="grand")
    pair.template(http, [
        {"id": "c0", "agent": agent, "prompt": "c0 {{input}}"},
        {"id": "c1", "workflow": {"template": "grand", "input": "steps.c0.output"}, "depends_on": ["c0"]}],
        name="child")
    return pair.template(http, [
        {"id": "p0", "agent": agent, "prompt": "p0 {{input}}"},
        {"id": "p1", "workflow": {"template": "child", "input": "steps.p0.output"}, "depends_on": ["p0"]},
        {"id": "p2", "agent": agent, "prompt": "p2 {{steps.p1.output}}", "depends_on": ["p1"]}], name="top")


def runs_below(http: httpx.Client, trace_id: str) -> list[dict]:
    """Every run under `trace_id` (children, grandchildren), from the step entries."""
    found, level = [], [trace_id]
    while level:
        nxt = []
        for tid in level:
            for step in http.get(f"/workflow/run/{tid}").json()["steps"]:
                if step.get("child_trace_id"):
                    nxt.append(step["child_trace_id"])
        found += [http.get(f"/workflow/run/{t}").json() for t in nxt]
        level = nxt
    return found


def test_kill_9_of_the_owner_mid_grandchild_finishes_the_chain_without_repeats(pair):
    _, worker = pair.provider_and_worker(pair.http_a)
    top = chain(pair, worker)
    pair.fake.script(
        ScriptedReply(text="P0"), ScriptedReply(text="C0"), ScriptedReply(text="G1"),
        ScriptedReply(text="never seen", initial_delay=60),   # g2: in flight at the kill
        ScriptedReply(text="G2"),                              # g2 again, on the survivor
        ScriptedReply(text="P2"))
    trace_id = pair.run(pair.http_a, top, input="acme")

    def g2_in_flight():  # its start stored (so g1's end is too), its model call made
        below = runs_below(pair.http_b, trace_id)
        return (len(below) == 2 and prompts(pair.fake).get("g2 G1")
                and any(k == "step_started" and d.get("step_id") == "g2"
                        for _, k, d in stored(pair.http_b, below[1]["trace_id"])))

    wait_for(g2_in_flight, 30)
    pair.a.kill()  # SIGKILL: the parent's, the child's and the grandchild's owner
    with pair.http_b.stream("GET", f"/workflow/sse/{trace_id}", timeout=90) as response:
        frames = list(sse_frames(response))
    assert frames[-1][1] == "run_finished", frames[-1]
    counted = prompts(pair.fake)
    assert frames[-1][2]["output"] == "P2", counted
    assert counted["p0 acme"] == 1 and counted["c0 P0"] == 1 and counted["g1 C0"] == 1
    assert counted["g2 G1"] == 2  # the one step in flight at the kill, and only it, again
    assert counted["p2 G2"] == 1
    below = runs_below(pair.http_b, trace_id)
    assert [r["template_name"] for r in below] == ["child", "grand"]  # one of each, never two
    assert all(r["status"] == "succeeded" for r in below)
    assert below[0]["parent"] == {"trace_id": trace_id, "path": "p1"}
    assert below[1]["parent"] == {"trace_id": below[0]["trace_id"], "path": "c1"}
    for run in [trace_id, *(r["trace_id"] for r in below)]:
        assert any(k == "run_resumed" for _, k, _ in stored(pair.http_b, run)), run
    kinds = [k for _, k, _ in frames]
    assert kinds.count("child_started") == 1 and kinds.count("child_finished") == 1


def test_cancelling_the_parent_on_the_other_process_cancels_every_descendant(pair):
    pair.template(pair.http_a, [{"id": "q", "agent": {"human": True}, "prompt": "wait"}], name="leaf")
    pair.template(pair.http_a, [{"id": "m", "workflow": {"template": "leaf", "input": "input"}}], name="middle")
    top = pair.template(pair.http_a, [{"id": "t", "workflow": {"template": "middle", "input": "input"}}],
                        name="top")
    trace_id = pair.run(pair.http_a, top)

    def leaf_waits():
        below = runs_below(pair.http_b, trace_id)
        return len(below) == 2 and below[1]["status"] == "waiting_reply" and below

    below = wait_for(leaf_waits, 30)
    began = time.monotonic()
    cancelled = pair.http_b.post(f"/workflow/cancel/{trace_id}")
    assert cancelled.status_code == 200, cancelled.text
    everyone = [trace_id, *(r["trace_id"] for r in below)]
    wait_for(lambda: all(pair.http_b.get(f"/workflow/run/{t}").json()["status"] == "cancelled"
                         for t in everyone), 2.0, every=0.02)
    assert time.monotonic() - began < 2.0


@pytest.fixture
def target():
    with FakeHttp() as server:
        yield server


def test_a_secret_in_a_header_never_surfaces_anywhere(tmp_path, target):
    with OTLPReceiver() as receiver:
        server = ServerProcess(tmp_path / "home", env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50",
            "ORCHESTRA_LOG_FORMAT": "json", "ORCHESTRA_METRICS": "true", "ORCHESTRA_STEP_EGRESS_ALLOW": f"127.0.0.1:{target.port}",
        }).start()
        try:
            admin = httpx.Client(base_url=server.base_url + "/api/v1", timeout=15,
                                 headers=login(server, "root", "ADMINISTRATOR"))
            made = admin.post("/resource/secret", json={"name": "CRM", "value": SECRET, "hosts": ["127.0.0.1"]})
            assert made.status_code == 201 and SECRET not in made.text
            steps = [
                {"id": "echo", "http": {"method": "POST", "url": target.url + "/echo?key={{ secrets.CRM }}",
                                        "headers": {"Authorization": "Bearer {{ secrets.CRM }}"},
                                        "body": {"q": "{{ input }}"}}},
                {"id": "fails", "depends_on": ["echo"], "on_error": "continue", "retry": {"max_attempts": 2},
                 "http": {"method": "GET", "url": target.url + "/status/500?key={{ secrets.CRM }}",
                          "headers": {"X-Key": "{{ secrets.CRM }}"}}},
                {"id": "refused", "depends_on": ["fails"], "http": {
                    "method": "GET", "url": "http://127.0.0.1:1/?key={{ secrets.CRM }}",
                    "headers": {"X-Key": "{{ secrets.CRM }}"}}},
            ]
            template = admin.post("/workflow/template", json={"name": "crm", "steps": steps})
            assert template.status_code == 201, template.text
            started = admin.post("/workflow/run", json={"template_id": template.json()["template_id"],
                                                        "input": "acme"})
            trace_id = started.json()["trace_id"]
            with admin.stream("GET", f"/workflow/sse/{trace_id}") as response:
                frames = list(sse_frames(response))
            assert frames[-1][1] == "run_failed"
            # it went where it was entered for
            sent = [r for r in target.requests if r["path"] in ("/echo", "/status/500")]
            assert sent and all(r["headers"].get("authorization", "") == f"Bearer {SECRET}"
                                or r["headers"].get("x-key") == SECRET for r in sent)
            detail = admin.get(f"/workflow/run/{trace_id}")
            listed = admin.get(f"/workflow/run/{trace_id}/events")
            echoed = next(s for s in detail.json()["steps"] if s["step_id"] == "echo")["output"]
            assert echoed["body"]["headers"]["authorization"] == "Bearer ***"
            assert echoed["headers"]["x-echo-authorization"] == "Bearer ***"
            assert echoed["body"]["query"]["key"] == "***"
            errors = " ".join(s["error"] or "" for s in detail.json()["steps"])
            assert "HTTP 500" in errors and "egress rule" in errors and "key=***" in errors
            metrics = httpx.get(server.base_url + "/metrics", timeout=10)
            assert metrics.status_code == 200
            time.sleep(0.5)  # spans are exported every 50 ms
            spans = json.dumps([[s.name, s.attributes] for s in receiver.received()])
            assert '"http GET"' in spans or '"http POST"' in spans
            everything = {"stream": json.dumps(frames), "detail": detail.text, "events": listed.text,
                          "metrics": metrics.text, "spans": spans}
        finally:
            server.stop()
        everything["log"] = server.log_path.read_text()
        for where, text in everything.items():
            assert SECRET not in text, where
        assert "***" in everything["spans"] and "***" in everything["stream"]


REFUSED = {  # step id: (URL, what the error names)
    "loopback": ("http://127.0.0.1:{other}/", "127.0.0.1"),
    "ipv6_loopback": ("http://[::1]:{port}/", "::1"),
    "private": ("http://10.0.0.1:{port}/", "10.0.0.1"),
    "metadata": ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
    "name_to_loopback": ("http://localhost:{other}/", "localhost"),
    "redirect_to_loopback": ("http://127.0.0.1:{port}/redirect?to=http://127.0.0.1:{other}/echo", "127.0.0.1:{other}"),
}


def test_every_refused_address_class_is_refused(tmp_path, target):
    with FakeHttp() as other:  # a real server the rule does not allow: it must see nothing
        server = ServerProcess(tmp_path / "home", env={
            "ORCHESTRA_STEP_EGRESS_ALLOW": f"127.0.0.1:{target.port}"}).start()
        try:
            http = httpx.Client(base_url=server.base_url + "/api/v1", timeout=15, headers=login(server, "user1"))
            steps = [{"id": sid, "on_error": "continue",
                      "http": {"method": "GET", "url": url.format(port=target.port, other=other.port)}}
                     for sid, (url, _) in REFUSED.items()]
            made = http.post("/workflow/template", json={"name": "x", "steps": steps})
            assert made.status_code == 201, made.text
            trace_id = http.post("/workflow/run", json={"template_id": made.json()["template_id"]}).json()["trace_id"]
            run = wait_for(lambda: (r := http.get(f"/workflow/run/{trace_id}").json())["status"] == "succeeded"
                           and r, 30)
        finally:
            server.stop()
        errors = {s["step_id"]: s["error"] for s in run["steps"]}
        for sid, (_, shown) in REFUSED.items():
            error = errors[sid] or ""
            assert "egress rule" in error and "ORCHESTRA_STEP_EGRESS_ALLOW" in error, (sid, error)
            assert shown.format(other=other.port) in error, (sid, error)
            assert "Errno" not in error and "ConnectError" not in error, (sid, error)
        assert other.requests == []
        assert [r["path"] for r in target.requests] == ["/redirect"]  # the allowed hop only


def test_a_child_template_deleted_while_its_parent_waits_fails_that_step(tmp_path, target):
    server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_STEP_EGRESS_ALLOW": f"127.0.0.1:{target.port}"}).start()
    try:
        http = httpx.Client(base_url=server.base_url + "/api/v1", timeout=15, headers=login(server, "user1"))
        leaf = http.post("/workflow/template", json={"name": "leaf", "steps": [
            {"id": "q", "agent": {"human": True}, "prompt": "wait"}]}).json()["template_id"]
        top = http.post("/workflow/template", json={"name": "top", "steps": [
            {"id": "call", "workflow": {"template": "leaf", "input": "input"}},
            {"id": "big", "on_error": "continue",  # an answer over 1 MiB, no Content-Length
             "http": {"method": "GET", "url": target.url + "/big/2000000?chunked=1"}}]})
        assert top.status_code == 201, top.text
        trace_id = http.post("/workflow/run", json={"template_id": top.json()["template_id"]}).json()["trace_id"]
        below = wait_for(lambda: (b := runs_below(http, trace_id)) and b[0]["status"] == "waiting_reply" and b, 30)
        deleted = http.delete(f"/workflow/template/{leaf}")
        assert deleted.status_code in (200, 204), deleted.text
        run = wait_for(lambda: (r := http.get(f"/workflow/run/{trace_id}").json())["status"] == "failed" and r, 15)
        child = wait_for(lambda: (c := http.get(f"/workflow/run/{below[0]['trace_id']}").json())["status"]
                         in ("cancelled", "failed") and c, 15)
    finally:
        server.stop()
    steps = {s["step_id"]: s for s in run["steps"]}
    assert steps["call"]["status"] == "failed"
    assert f"The child template '{leaf}' was deleted while this step waited" in steps["call"]["error"]
    assert run["error"] and "was deleted" in run["error"], run["error"]
    assert child["status"] == "cancelled", child
    assert steps["big"]["status"] == "failed" and "larger than 1048576 bytes" in steps["big"]["error"]
