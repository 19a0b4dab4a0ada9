"""A child run's question, seen on its parent (issue 39, point 2): `workflow watch PARENT`
on a real terminal sends the typed answer to the child run that asks it, the piped
hint names the child's trace and `workflow reply PARENT … --request-id …` reaches the
child too, and a refused answer is left with Enter alone, not only Ctrl-D."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.cli.cli_harness import api_world
from tests.cli.test_live_view import Terminal

CHILD = {"name": "ask_child", "steps": [
    {"id": "ask", "agent": {"human": True}, "prompt": "Which tea?"}]}
PARENT = {"name": "ask_parent", "steps": [
    {"id": "sub", "workflow": {"template": "ask_child", "input": "input"}}]}
STRICT_CHILD = {"name": "strict_child", "steps": [{
    "id": "approve", "agent": {"human": True}, "prompt": "Approve?",
    "output_schema": {"type": "object", "required": ["approved"],
                      "properties": {"approved": {"type": "boolean"}}}}]}
STRICT_PARENT = {"name": "strict_parent", "steps": [
    {"id": "sub", "workflow": {"template": "strict_child", "input": "input"}}]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        for body in (CHILD, PARENT, STRICT_CHILD, STRICT_PARENT):
            created = info["api"].post("/workflow/template", json=body)
            assert created.status_code == 201, created.text
        yield info


def _start(world, name: str) -> str:
    started = world["api"].post("/workflow/run", json={"template_id": _template(world, name), "input": "tea"})
    assert started.status_code == 202, started.text
    return started.json()["trace_id"]


def _template(world, name: str) -> str:
    listed = world["api"].get("/workflow/template").json()["templates"]
    return next(t["template_id"] for t in listed if t["name"] == name)


def _child_waiting(world, parent: str, timeout: float = 30) -> tuple[str, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = world["api"].get(f"/workflow/run/{parent}").json()
        child = run["steps"][0].get("child_trace_id")
        if child:
            pending = world["api"].get(f"/workflow/run/{child}").json()["pending_replies"]
            if pending:
                return child, pending[0]
        time.sleep(0.1)
    raise AssertionError("the child never asked")


def _status(world, trace_id: str, wanted: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = world["api"].get(f"/workflow/run/{trace_id}").json()
        if run["status"] == wanted:
            return run
        time.sleep(0.1)
    raise AssertionError(f"{trace_id} never became {wanted}: {run['status']}")


def test_an_answer_typed_while_watching_the_parent_goes_to_the_child(world):
    parent = _start(world, "ask_parent")
    child, _ = _child_waiting(world, parent)
    term = Terminal(world, "workflow", "watch", parent)
    try:
        assert term.read_until("your answer: "), term.screen[-2000:]
        term.type("oolong\r")
        code = term.finish(timeout=60)
    finally:
        term.kill()
    assert "not taken" not in term.screen, term.screen[-3000:]
    assert code == 0, term.screen[-3000:]
    assert _status(world, child, "succeeded")["steps"][0]["output"] == "oolong"
    assert _status(world, parent, "succeeded")["steps"][0]["output"] == "oolong"


def test_the_piped_hint_names_the_child_and_the_parent_reply_reaches_it(world):
    parent = _start(world, "ask_parent")
    child, pending = _child_waiting(world, parent)
    watcher = subprocess.Popen([sys.executable, "-m", "orchestra", "workflow", "watch", parent],
                               env=world["cli"].env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        replied = world["cli"]("workflow", "reply", parent, "sencha", "--request-id", pending["request_id"])
        assert replied.returncode == 0, replied.stderr
        assert child in replied.stderr
        out, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    assert f"answer with: orchestra workflow reply {child} 'YOUR ANSWER' --request-id {pending['request_id']}" \
        in out, out
    assert _status(world, child, "succeeded")["steps"][0]["output"] == "sencha"
    _status(world, parent, "succeeded")


def test_a_refused_answer_is_left_with_enter_and_the_watch_goes_on(world):
    parent = _start(world, "strict_parent")
    child, pending = _child_waiting(world, parent)
    term = Terminal(world, "workflow", "watch", parent)
    try:
        assert term.read_until("your answer: "), term.screen[-2000:]
        term.type("yes\r")
        assert term.read_until("not taken: that is not JSON"), term.screen[-2000:]
        assert term.read_until("Enter alone to leave the question open; your answer: "), term.screen[-2000:]
        term.type("\r")
        assert term.read_until("the question stays open"), term.screen[-2000:]
        assert f"orchestra workflow reply {child} 'YOUR ANSWER' --request-id {pending['request_id']}" \
            in term.screen.replace("\n", ""), term.screen[-2000:]
        assert term.proc.poll() is None  # the watch goes on
        answered = world["api"].post(f"/workflow/reply/{child}", json={
            "content": {"approved": True}, "request_id": pending["request_id"]})
        assert answered.status_code == 200, answered.text
        code = term.finish(timeout=60)
    finally:
        term.kill()
    assert code == 0, term.screen[-3000:]
    _status(world, parent, "succeeded")
