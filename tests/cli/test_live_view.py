"""The live view on a real terminal (a pty, 60 columns): long lines wrap instead of being
cut, and the prompt of a question is withdrawn (saying so) when the question is answered
elsewhere or the run is cancelled, and the cancelled step is not left `waiting_reply`."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from orchestra.cli.console import ExitCode
from tests.cli.cli_harness import api_world

COLUMNS = 60
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")
HEADER = re.compile(r"^run ([0-9a-f-]{36})\s*$", re.M)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        yield info


class Terminal:
    """`orchestra …` on a pty of COLUMNS columns; `screen` is everything it wrote, as text."""

    def __init__(self, world, *args: str) -> None:
        self.master, slave = pty.openpty()
        import fcntl
        import struct
        import termios

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
        env = {**world["cli"].env, "COLUMNS": str(COLUMNS), "LINES": "40", "TERM": "xterm"}
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestra", *args], env=env,
                                     stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        self.raw = b""

    @property
    def screen(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def read_until(self, text: str, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while text not in self.screen and time.monotonic() < deadline:
            if not self._read(0.2):
                break
        return text in self.screen

    def _read(self, wait: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], wait)
        if ready:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return False
            if not chunk:
                return False
            self.raw += chunk
        return True

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def finish(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        while self._read(0.1) and select.select([self.master], [], [], 0)[0]:
            pass
        code = self.proc.wait(timeout=5)
        os.close(self.master)
        return code

    def final_view(self) -> str:
        """The view printed when the watch ended (after the last redraw of the live one)."""
        screen = self.screen
        starts = [m.start() for m in HEADER.finditer(screen)]
        assert starts, screen[-3000:]
        return screen[starts[-1]:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def _pending(world, trace_id: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = world["api"].get(f"/workflow/run/{trace_id}").json()
        if run["pending_replies"]:
            return run["pending_replies"][0]
        time.sleep(0.1)
    raise AssertionError("the run never asked")


def _trace_id(term: Terminal) -> str:
    match = HEADER.search(term.screen)
    assert match, term.screen[-2000:]
    return match.group(1)


def test_long_lines_wrap_at_the_terminal_width(world):
    words = [f"word{i:03d}" for i in range(1, 21)]  # 160 characters (the fake echoes up to 200)
    term = Terminal(world, "workflow", "run", "three_step", "--input", " ".join(words), "--watch")
    try:
        code = term.finish(timeout=60)
    finally:
        term.kill()
    final = term.final_view()
    assert code == 0, final
    lines = final.splitlines()
    assert max(len(line) for line in lines) <= COLUMNS, "\n".join(lines)
    facts = final[final.index("facts · succeeded"):final.index("numbers · succeeded")]
    assert all(word in facts for word in words), facts  # nothing cut off: every word is there
    inside = [line.strip("│ ") for line in facts.splitlines()[1:] if line.startswith("│")]
    assert len(inside) >= 4  # the one long line became several
    assert "run succeeded in " in final


def _asking(world) -> tuple[Terminal, str, dict]:
    """`run with_human --watch` on the pty, once its question is at the prompt."""
    term = Terminal(world, "workflow", "run", "with_human", "--input", "tea", "--watch")
    assert term.read_until("your answer: "), term.screen[-2000:]
    trace_id = _trace_id(term)
    return term, trace_id, _pending(world, trace_id)


def test_prompt_is_withdrawn_when_answered_elsewhere(world):
    term, trace_id, pending = _asking(world)
    try:
        term.type("half typed")  # not entered yet when the answer comes from elsewhere
        time.sleep(0.3)
        answered = world["api"].post(f"/workflow/reply/{trace_id}",
                                     json={"content": "from the console", "request_id": pending["request_id"]})
        assert answered.status_code == 200, answered.text
        assert term.read_until("prompt withdrawn"), term.screen[-2000:]
        code = term.finish(timeout=60)
    finally:
        term.kill()
    screen = term.screen
    assert "prompt withdrawn: it was answered elsewhere; anything typed here was not sent" in screen
    assert code == 0, screen[-3000:]
    final = term.final_view()
    assert "feedback · succeeded" in final and "! from the console" in final
    assert "Feedback: from the console" in final
    run = world["api"].get(f"/workflow/run/{trace_id}").json()
    feedback = next(s for s in run["steps"] if s["step_id"] == "feedback")
    assert feedback["output"] == "from the console"  # the half-typed text was never sent


def test_prompt_is_withdrawn_when_the_run_is_cancelled(world):
    term, trace_id, _ = _asking(world)
    try:
        cancelled = world["api"].post(f"/workflow/cancel/{trace_id}")
        assert cancelled.status_code == 200, cancelled.text
        assert term.read_until("prompt withdrawn"), term.screen[-2000:]
        code = term.finish(timeout=60)
    finally:
        term.kill()
    screen = term.screen
    assert "prompt withdrawn: the run was cancelled; anything typed here was not sent" in screen
    assert code == ExitCode.ERROR
    final = term.final_view()
    assert "feedback · cancelled" in final and "waiting_reply" not in final, final
    assert "run cancelled" in final
    assert screen.count(f"error: run {trace_id} cancelled") == 1


def test_an_answer_typed_at_the_prompt_is_sent(world):
    term, trace_id, _ = _asking(world)
    try:
        term.type("less sugar\r")
        code = term.finish(timeout=60)
    finally:
        term.kill()
    final = term.final_view()
    assert code == 0, term.screen[-3000:]
    assert "feedback asks the question above; your answer: " in term.screen
    assert "Feedback: less sugar" in final and "run succeeded in " in final
    assert "started run" not in term.screen
    assert world["api"].get(f"/workflow/run/{trace_id}").json()["steps"][1]["output"] == "less sugar"


def emulated(raw: bytes, *, history: bool = True) -> list[str]:
    """What a real terminal of COLUMNS x 40 shows after `raw`: the lines scrolled off the
    top (history), then the screen, without trailing blanks."""
    import pyte

    screen = pyte.HistoryScreen(COLUMNS, 40, history=2000)
    stream = pyte.ByteStream(screen)
    stream.feed(raw)
    rows = [line for line in screen.history.top] if history else []
    text = ["".join(row[x].data for x in range(COLUMNS)).rstrip() for row in rows]
    return text + [line.rstrip() for line in screen.display]


def test_after_an_answered_question_the_screen_holds_one_copy_of_the_view(world):
    """While waiting, the question is on screen once (in the panel, not repeated at the
    prompt); once answered, the still copy and the prompt are taken away and the view goes
    on live: at the end the terminal shows exactly one copy of it."""
    term, trace_id, _ = _asking(world)
    try:
        waiting = emulated(term.raw)
        assert sum("Here is the draft:" in line for line in waiting) == 1, "\n".join(waiting)
        assert sum(line.startswith(f"run {trace_id}") for line in waiting) == 1, "\n".join(waiting)
        term.type("less sugar\r")
        code = term.finish(timeout=60)
    finally:
        term.kill()
    assert code == 0, term.screen[-3000:]
    lines = emulated(term.raw)
    shown = "\n".join(lines)
    assert sum(line.startswith(f"run {trace_id}") for line in lines) == 1, shown
    for step_id in ("draft", "feedback", "final"):
        assert sum(f"─ {step_id} · " in line for line in lines) == 1, (step_id, shown)
    assert "your answer" not in shown  # the prompt went with the still copy
    assert "! less sugar" in shown and "run succeeded in " in shown


APPROVAL = {"name": "approval", "steps": [{
    "id": "approve", "agent": {"human": True}, "prompt": "Approve the tea order?",
    "output_schema": {"type": "object", "required": ["approved"], "properties": {
        "approved": {"type": "boolean"}, "notes": {"type": "string"}}}}]}


def test_a_refused_answer_is_said_and_asked_again_at_once(world):
    """A JSON question says what it wants; `yes` is refused in one line that stays, the
    prompt comes back at once, and the valid answer typed next is sent (issue 29, item 1)."""
    created = world["api"].post("/workflow/template", json=APPROVAL)
    assert created.status_code in (201, 409), created.text
    term = Terminal(world, "workflow", "run", "approval", "--input", "tea", "--watch")
    try:
        assert term.read_until("your answer: "), term.screen[-2000:]
        trace_id = _trace_id(term)
        asked = term.screen
        assert "answer with a JSON object: approved (boolean, required), notes (string)" in asked
        assert 'e.g. {"approved": true, "notes": "…"}' in asked
        term.type("yes\r")
        assert term.read_until("not taken: that is not JSON"), term.screen[-2000:]
        deadline = time.monotonic() + 5
        while "your answer: " not in term.screen.split("not taken:", 1)[1] and time.monotonic() < deadline:
            term._read(0.1)
        assert "your answer: " in term.screen.split("not taken:", 1)[1], term.screen[-2000:]
        time.sleep(0.5)
        assert world["api"].get(f"/workflow/run/{trace_id}").json()["status"] == "waiting_reply"
        term.type('{"approved": true, "notes": "fine"}\r')
        code = term.finish(timeout=60)
    finally:
        term.kill()
    assert code == 0, term.screen[-3000:]
    run = world["api"].get(f"/workflow/run/{trace_id}").json()
    assert run["status"] == "succeeded"
    assert run["steps"][0]["output"] == {"approved": True, "notes": "fine"}


@contextmanager
def example_template(world, stem: str) -> Iterator[str]:
    """examples/templates/<stem>.json saved for the test (its template_id), deleted after."""
    from tests.cli.cli_harness import EXAMPLES

    created = world["api"].post("/workflow/template", json=json.loads((EXAMPLES / f"{stem}.json").read_text()))
    assert created.status_code == 201, created.text
    try:
        yield created.json()["template_id"]
    finally:
        world["api"].delete(f"/workflow/template/{created.json()['template_id']}")


def test_the_final_view_shows_skipped_steps_as_skipped_and_the_run_output(world):
    """Issue 29, items 2 and 5, on a terminal: the branch that did not run is `skipped`
    with its reason (it was `cancelled` with an empty panel), and the output closes the view."""
    with example_template(world, "routing") as template_id:
        term = Terminal(world, "workflow", "run", template_id, "--input", "help", "--watch")
        try:
            code = term.finish(timeout=60)
        finally:
            term.kill()
        assert code == 0, term.screen[-3000:]
        final = term.final_view()
        assert final.count("· skipped") == 1 and "skipped: its `when` was false" in final, final
        assert "cancelled" not in final and "waiting for the agent" not in final, final
        assert "output:" in final and '"reply":' in final, final
        assert final.rstrip().splitlines()[-1].startswith("run succeeded in ")


def test_a_question_inside_a_loop_shows_what_it_asks_about(world):
    """Issue 29, item 3: `improve#1.review · waiting_reply` is shown with its question (the
    draft it asks about), in the loop's panel above the prompt."""
    with example_template(world, "review_until_approved") as template_id:
        term = Terminal(world, "workflow", "run", template_id, "--input", "tea", "--watch")
        try:
            assert term.read_until("your answer: "), term.screen[-2000:]
            waiting = "\n".join(emulated(term.raw))
            at = waiting.index("improve#1.review · waiting_reply: ")
            flat = re.sub(r"[│\s]+", " ", waiting[at:])  # the panel wraps it at 60 columns
            assert "? Draft 1: Echo: Round 1: write a short text about tea" in flat, waiting
            term.type("approve\r")
            code = term.finish(timeout=60)
        finally:
            term.kill()
        assert code == 0, term.screen[-3000:]
