"""`orchestra workflow …` against a real server process and a real fake LLM server."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from orchestra.cli.console import ExitCode
from tests.cli.cli_harness import PASSWORD, ClientCLI, logged_in_world, setup_world
from tests.conftest import ServerProcess
from tests.fakes.fake_llm import FakeLLM


@pytest.fixture(scope="module")
def llm():
    with FakeLLM() as fake:
        yield fake


@pytest.fixture(scope="module")
def world(llm, tmp_path_factory):
    """One server + provider + worker + both example templates for the module (each test
    waits for its runs to end); a client CLI logged in as root."""
    with logged_in_world(tmp_path_factory, llm.base_url) as info:
        info.update(llm=llm)
        yield info


def template_id(world, stem: str) -> str:
    return world["templates"][stem]["template_id"]


def stored_events(world, trace_id: str) -> list[dict]:
    response = httpx.get(f"{world['server'].base_url}/api/v1/workflow/run/{trace_id}/events",
                         headers={"Authorization": f"Bearer {world['token']}"})
    assert response.status_code == 200, response.text
    return response.json()["events"]


def wait_status(world, trace_id: str, status: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = httpx.get(f"{world['server'].base_url}/api/v1/workflow/run/{trace_id}",
                        headers={"Authorization": f"Bearer {world['token']}"}).json()
        if run["status"] == status or time.monotonic() > deadline:
            assert run["status"] == status, run
            return run
        time.sleep(0.1)


def test_run_then_watch_renders_every_step_output_and_final_status(world):
    cli = world["cli"]  # no --server/--token: the login kept them
    started = cli("workflow", "run", template_id(world, "three_step"), "--input", "the moon landing")
    assert started.returncode == 0, started.stderr
    trace_id = started.stdout.strip()
    assert len(trace_id) == 36

    watched = cli("workflow", "watch", trace_id)
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    assert lines[0] == f"run {trace_id} started (steps: facts, numbers, report)"
    for step in ("facts", "numbers", "report"):
        assert f"[{step}] started" in lines
        assert any(line.startswith(f"[{step}] finished in ") for line in lines), lines
    assert "    Echo: List the key facts in: the moon landing" in lines
    assert "    Echo: Work out 12 * 7 + 1 for the report about: the moon landing" in lines
    report = lines.index(next(line for line in lines if line.startswith("[report] finished")))
    assert lines[report + 1] == "    Echo: Write a short report."
    assert lines[-1].startswith("run succeeded in ")
    # the report step started only after both of its dependencies finished
    assert lines.index("[report] started") > max(
        lines.index(next(x for x in lines if x.startswith(f"[{s}] finished"))) for s in ("facts", "numbers"))

    listed = cli("workflow", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    body = json.loads(listed.stdout)
    (listed_run,) = [r for r in body["runs"] if r["trace_id"] == trace_id]
    assert listed_run["status"] == "succeeded"
    assert {t["name"] for t in body["templates"]} == {"three_step", "with_human"}
    table = cli("workflow", "list", "runs")
    assert table.returncode == 0 and trace_id in table.stdout and "succeeded" in table.stdout
    shown = json.loads(cli("workflow", "show", trace_id, "--json").stdout)
    assert shown["status"] == "succeeded"
    assert [s["step_id"] for s in shown["steps"]] == ["facts", "numbers", "report"]
    plain = cli("workflow", "show", trace_id)
    assert plain.returncode == 0 and "Echo: List the key facts in: the moon landing" in plain.stdout


def test_piped_output_wrapped_at_the_width_keeps_its_indent(world):
    """At a known width (here $COLUMNS) a long output line wraps at spaces, each piece
    under the same four-space indent; no line is wider than the width, no word is lost."""
    cli = world["cli"]
    started = cli("workflow", "run", template_id(world, "three_step"), "--input", "the moon landing")
    assert started.returncode == 0, started.stderr
    watched = cli("workflow", "watch", started.stdout.strip(), env={"COLUMNS": "40"})
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    numbers = lines.index(next(line for line in lines if line.startswith("[numbers] finished")))
    block = []
    for line in lines[numbers + 1:]:
        if not line.startswith("    "):
            break
        block.append(line)
    assert len(block) > 1 and all(len(line) <= 40 for line in block), block
    assert " ".join(line.strip() for line in block) == \
        "Echo: Work out 12 * 7 + 1 for the report about: the moon landing"


def test_a_closed_pipe_ends_a_watch_quietly(world):
    world["llm"].chunk_delay = 0.05  # events keep coming after the reader has gone
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestra", "workflow", "run", template_id(world, "three_step"),
             "--input", "x", "--watch", "--json"],
            env=world["cli"].env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = json.loads(proc.stdout.readline())
        proc.stdout.close()  # like `| head -1`
        _, err = proc.communicate(timeout=30)
    finally:
        world["llm"].chunk_delay = 0.0
    assert first["event"] == "run_started"
    assert proc.returncode == 0 and err == ""
    wait_status(world, first["data"]["trace_id"], "succeeded")  # the run went on without us


def test_run_watch_json_prints_raw_events_one_per_line(world):
    cli = world["cli"]
    done = cli("workflow", "run", template_id(world, "three_step"), "--input", "x", "--watch", "--json")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["event"] == "run_started" and events[-1]["event"] == "run_finished"
    trace_id = events[0]["data"]["trace_id"]
    stored = stored_events(world, trace_id)
    assert [(e["id"], e["event"], e["data"]) for e in events] == [
        (s["seq"], s["kind"], s["data"]) for s in stored]
    assert {e["event"] for e in events} >= {"step_started", "token", "step_finished"}


def test_reply_resumes_a_waiting_run_while_it_is_watched(world):
    cli = world["cli"]
    started = cli("workflow", "run", template_id(world, "with_human"), "--input", "tea")
    trace_id = started.stdout.strip()
    watcher = subprocess.Popen([sys.executable, "-m", "orchestra", "workflow", "watch", trace_id],
                               env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run = wait_status(world, trace_id, "waiting_reply")
        (pending,) = run["pending_replies"]
        assert pending["step_id"] == "feedback"

        stale = cli("workflow", "reply", trace_id, "too early", "--request-id", "not-the-request")
        assert stale.returncode == ExitCode.CONFLICT
        assert len(stale.stderr.strip().splitlines()) == 1

        replied = cli("workflow", "reply", trace_id, "make it shorter", "--request-id", pending["request_id"])
        assert replied.returncode == 0, replied.stderr
        out, err = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    lines = out.splitlines()
    assert "[feedback] question: Here is the draft:" in lines
    assert f"[feedback]   answer with: orchestra workflow reply {trace_id} 'YOUR ANSWER' " \
           f"--request-id {pending['request_id']}" in lines
    assert "[feedback] reply received: make it shorter" in lines
    assert "    Feedback: make it shorter" in lines  # the final step saw the answer
    assert lines[-1].startswith("run succeeded")

    again = cli("workflow", "reply", trace_id, "late")
    assert again.returncode == ExitCode.CONFLICT and again.stderr.startswith("error: ")

    replayed = cli("workflow", "replay", trace_id, "--speed", "0")  # answered long ago: no hint
    assert replayed.returncode == 0 and "[feedback] question: Here is the draft:" in replayed.stdout
    assert "answer with" not in replayed.stdout and "[feedback] reply received: make it shorter" in replayed.stdout


def test_replay_at_speed_zero_and_paced(world):
    cli = world["cli"]
    done = cli("workflow", "run", template_id(world, "three_step"), "--input", "x", "--watch", "--json")
    trace_id = json.loads(done.stdout.splitlines()[0])["data"]["trace_id"]
    fast = cli("workflow", "replay", trace_id, "--speed", "0", "--json")
    assert fast.returncode == 0, fast.stderr
    assert fast.stdout == done.stdout  # a finished run's replay is the same events
    plain = cli("workflow", "replay", trace_id, "--speed", "0")
    assert plain.returncode == 0 and plain.stdout.splitlines()[-1].startswith("run succeeded")
    bad = cli("workflow", "replay", trace_id, "--speed", "-1")
    assert bad.returncode == ExitCode.USAGE


def test_failed_run_exits_non_zero_with_the_reason(world):
    world["llm"].script_error(400, "The model fake-model does not exist")
    cli = world["cli"]
    done = cli("workflow", "run", template_id(world, "with_human"), "--input", "x", "--watch")
    assert done.returncode == ExitCode.ERROR
    assert "[draft] failed" in done.stdout and "does not exist" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("run failed")
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: run ") and line.endswith(" failed")
    assert (done.stdout + done.stderr).count("does not exist") == 1  # the reason, once
    as_json = cli("workflow", "replay", line.split()[2], "--speed", "0", "--json")
    assert as_json.stderr.count("does not exist") == 1  # raw events on stdout: stderr says why


def test_unknown_run_or_template_is_one_line_and_an_exit_code(world):
    cli = world["cli"]
    for args, code in (
        (["workflow", "watch", "no-such-run"], ExitCode.NOT_FOUND),
        (["workflow", "replay", "no-such-run", "--speed", "0"], ExitCode.NOT_FOUND),
        (["workflow", "reply", "no-such-run", "hi"], ExitCode.NOT_FOUND),
        (["workflow", "run", "no-such-template", "--input", "x"], None),
        (["workflow", "list", "nonsense"], ExitCode.USAGE),
    ):
        done = cli(*args)
        assert done.returncode != 0 and (code is None or done.returncode == code), (args, done)
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr


def test_bad_token_is_refused_readably(world):
    cli = world["cli"]
    done = cli("workflow", "list", "--token", "not-a-jwt")
    assert done.returncode == ExitCode.AUTH
    assert len(done.stderr.strip().splitlines()) == 1


def expire_kept_access_token(cli, server) -> dict:
    """Replace the CLI's kept access token by an expired copy; the kept login as it was."""
    kept = cli.kept()
    cli.credentials.write_text(json.dumps({**kept, "access_token": server.expired(kept["access_token"])}))
    return kept


@pytest.mark.e2e
def test_expired_access_token_is_refreshed_and_kept(llm, tmp_path):
    server = ServerProcess(tmp_path / "srv").start()
    try:
        world = setup_world(server, llm.base_url)
        cli = ClientCLI(tmp_path / "client")
        assert cli("login", "--server", server.base_url, "--user", "root", "--password-stdin",
                   input=PASSWORD + "\n").returncode == 0
        before = expire_kept_access_token(cli, server)
        done = cli("workflow", "list", "templates", "--json")
        assert done.returncode == 0, done.stderr
        assert len(json.loads(done.stdout)["templates"]) == 2
        after = cli.kept()
        assert after["access_token"] != before["access_token"]
        assert after["refresh_token"] != before["refresh_token"]
        # The kept (rotated) pair works again once its access token expires: the old
        # refresh token would be refused.
        expire_kept_access_token(cli, server)
        done = cli("workflow", "run", world["templates"]["three_step"]["template_id"], "--input", "x",
                   "--watch")
        assert done.returncode == 0, done.stderr
    finally:
        server.stop()


def test_paced_keeps_the_recorded_spacing(world):
    from orchestra.cli.workflow import paced
    from orchestra.client import Client
    from orchestra.timestamps import parse_ts

    world["llm"].chunk_delay = 0.05  # a run that takes a visible while
    try:
        done = world["cli"]("workflow", "run", template_id(world, "three_step"), "--input",
                            "one two three four five", "--watch", "--json")
    finally:
        world["llm"].chunk_delay = 0.0
    trace_id = json.loads(done.stdout.splitlines()[0])["data"]["trace_id"]
    with Client(world["server"].base_url, access_token=world["token"]) as client:
        events = list(client.events(trace_id))
    stamps = [parse_ts(e.data["ts"]) for e in events]
    span = stamps[-1] - stamps[0]
    assert span > 0.3, span

    class Clock:
        """Time that passes only when the replay sleeps."""

        now = 0.0

        def __call__(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            assert seconds > 0
            self.now += seconds

    def timed(speed: float) -> list[float]:
        clock, seen = Clock(), []
        for _ in paced(events, speed, sleep=clock.sleep, clock=clock):
            seen.append(clock.now)
        return seen

    offsets = [stamp - stamps[0] for stamp in stamps]
    assert timed(1) == pytest.approx(offsets, abs=1e-9)  # every event at its recorded moment
    assert timed(4) == pytest.approx([o / 4 for o in offsets], abs=1e-9)
    assert timed(0) == [0.0] * len(events)  # no waits at all


def test_terminal_view_asks_the_question_at_the_prompt_and_replies(world):
    """On a terminal (a real pty) the live view shows panels and answers the question."""
    import os
    import pty
    import re
    import select

    master, slave = pty.openpty()
    env = {**world["cli"].env, "COLUMNS": "100", "LINES": "40", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestra", "workflow", "run", template_id(world, "with_human"),
         "--input", "tea", "--watch"],
        env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    screen, answered = b"", False
    deadline = time.monotonic() + 40
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the pty
                    break
                if not chunk:
                    break
                screen += chunk
            if not answered and b"your answer" in screen:
                os.write(master, b"less sugar\r")
                answered = True
            if proc.poll() is not None and not ready:
                break
        proc.wait(timeout=10)
    finally:
        proc.kill()
        os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode("utf-8", "replace"))
    assert answered, text[-2000:]
    assert proc.returncode == 0, text[-2000:]
    assert "feedback asks the question above; your answer: " in text
    assert "? Here is the draft:" in text  # the question, in its step's panel
    assert "╭─ final · succeeded" in text and "Feedback: less sugar" in text
    assert "run succeeded in " in text


def _example(world, stem: str) -> str:
    """Saves examples/templates/<stem>.json with the world's worker; its template_id."""
    from tests.cli.cli_harness import EXAMPLES

    body = json.loads((EXAMPLES / f"{stem}.json").read_text())
    created = httpx.post(f"{world['server'].base_url}/api/v1/workflow/template", json=body,
                         headers={"Authorization": f"Bearer {world['token']}"})
    assert created.status_code == 201, created.text
    return created.json()["template_id"]


def _forget(world, template: str) -> None:
    httpx.delete(f"{world['server'].base_url}/api/v1/workflow/template/{template}",
                 headers={"Authorization": f"Bearer {world['token']}"})


def test_piped_watch_says_skipped_steps_and_ends_with_the_run_output(world):
    """Issue 29, items 2 and 5: a skipped branch says `skipped` and why (never `cancelled`
    or `running`), and the run's output is shown above the last line; `workflow show`
    gives it too, in text and JSON."""
    routing = _example(world, "routing")
    try:
        done = world["cli"]("workflow", "run", routing, "--input", "my printer is on fire", "--watch")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        trace_id = lines[0].split()[1]
        run = wait_status(world, trace_id, "succeeded")
        skipped = [s["step_id"] for s in run["steps"] if s["status"] == "skipped"]
        assert len(skipped) == 1, run["steps"]
        assert f"[{skipped[0]}] skipped: its `when` was false" in lines
        assert run["output"]["category"] in ("technical", "billing") and run["output"]["reply"]
        assert lines[-1].startswith("run succeeded in ")
        at = lines.index("output:")
        assert json.loads("\n".join(lines[at + 1:-1])) == run["output"]
        shown = world["cli"]("workflow", "show", trace_id)
        assert shown.returncode == 0, shown.stderr
        text = shown.stdout
        assert f"{skipped[0]} · skipped" in text
        assert json.loads(text[text.index("\noutput\n") + 8:]) == run["output"]
        as_json = json.loads(world["cli"]("workflow", "show", trace_id, "--json").stdout)
        assert as_json["output"] == run["output"]
        events = world["cli"]("workflow", "events", trace_id, "--json")  # item 9: --json is taken
        assert events.returncode == 0, events.stderr
        assert json.loads(events.stdout)[-1]["data"]["output"] == run["output"]
    finally:
        _forget(world, routing)


def test_show_names_each_item_by_its_path(world):
    """Issue 29, item 6: a foreach's items are listed as research[0], research[1], …"""
    research = _example(world, "research_each_topic")
    try:
        done = world["cli"]("workflow", "run", research, "--input-json", "--input",
                            json.dumps({"topics": ["tea", "coffee", "cocoa"]}), "--watch")
        assert done.returncode == 0, done.stderr + done.stdout
        trace_id = done.stdout.splitlines()[0].split()[1]
        shown = world["cli"]("workflow", "show", trace_id)
        assert shown.returncode == 0, shown.stderr
        for n in range(3):
            assert f"research[{n}] · succeeded" in shown.stdout, shown.stdout
    finally:
        _forget(world, research)


def test_the_fake_model_follows_a_prompts_directives_through_a_run(world):
    """Issue 29, items 7 and 9: `fake:category=billing` routes the run to billing, and a
    step told `fake:fail=1` fails once, says so in a retrying line, and succeeds."""
    worker = {"worker": world["worker_id"]}
    body = {"name": "directed", "steps": [
        {"id": "classify", "agent": worker, "prompt": "Classify {{input}} fake:category=billing",
         "output_schema": {"type": "object", "required": ["category"], "properties": {
             "category": {"type": "string", "enum": ["technical", "billing"]}}}},
        {"id": "billing", "agent": worker, "depends_on": ["classify"],
         "when": "steps.classify.output.category == 'billing'",
         "prompt": "Answer the bill fake:fail=1", "retry": {"max_attempts": 2}},
        {"id": "technical", "agent": worker, "depends_on": ["classify"],
         "when": "steps.classify.output.category == 'technical'", "prompt": "Fix it"}]}
    created = httpx.post(f"{world['server'].base_url}/api/v1/workflow/template", json=body,
                         headers={"Authorization": f"Bearer {world['token']}"})
    assert created.status_code == 201, created.text
    try:
        done = world["cli"]("workflow", "run", created.json()["template_id"], "--input", "my bill", "--watch")
        assert done.returncode == 0, done.stderr + done.stdout
        lines = done.stdout.splitlines()
        assert "[technical] skipped: its `when` was false" in lines
        retrying = next(i for i, line in enumerate(lines) if line.startswith("[billing] attempt 1 failed, trying again"))
        started = [i for i, line in enumerate(lines) if line == "[billing] started"]
        assert len(started) == 2 and started[0] < retrying < started[1], lines
        run = wait_status(world, lines[0].split()[1], "succeeded")
        billing = next(s for s in run["steps"] if s["step_id"] == "billing")
        assert billing["status"] == "succeeded" and billing["attempt"] == 2
    finally:
        _forget(world, created.json()["template_id"])
