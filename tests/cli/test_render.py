"""The renderers on their own: what a terminal shows before the first token, after a
cancel, and how often a failure's reason is printed."""

from __future__ import annotations

import io
import re

from rich.console import Console

from orchestra.cli.render import LiveRenderer, PlainRenderer
from orchestra.client import Event

TRACE = "00000000-0000-0000-0000-000000000001"


def event(seq: int, kind: str, **data) -> Event:
    return Event(seq=seq, kind=kind, data={"trace_id": TRACE, "seq": seq, **data})


def live(width: int = 60) -> tuple[LiveRenderer, io.StringIO]:
    screen = io.StringIO()
    return LiveRenderer(TRACE, Console(file=screen, force_terminal=True, width=width)), screen


def text_of(renderable, width: int = 60) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    with console.capture() as capture:
        console.print(renderable)
    return capture.get()


def test_nothing_is_blank_while_the_first_answer_is_awaited():
    view, _ = live()
    try:
        assert "waiting for the run to start… 0s" in text_of(view.view())
        view.handle(event(1, "run_started", steps=["a"]))
        view.handle(event(2, "step_started", step_id="a"))
        shown = text_of(view.view())
        assert "a · running" in shown and "waiting for the agent…" in shown
        view.handle(event(3, "token", step_id="a", text="Hello"))
        shown = text_of(view.view())
        assert "Hello" in shown and "waiting for the agent" not in shown
    finally:
        view.close()


def test_a_cancel_leaves_no_step_waiting_and_long_lines_wrap():
    view, screen = live()
    view.handle(event(1, "run_started", steps=["ask"]))
    view.handle(event(2, "step_started", step_id="ask"))
    view.handle(event(3, "reply_requested", step_id="ask", request_id="r1", prompt="word " * 30))
    assert view.steps["ask"].status == "waiting_reply"
    view.handle(event(4, "run_cancelled", status="cancelled", reason="The run was cancelled."))
    view.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    final = plain[plain.rindex(f"run {TRACE}"):]
    assert max(len(line) for line in final.splitlines()) <= 60
    assert "ask · cancelled" in final and "waiting_reply" not in final
    assert final.count("word") == 30  # wrapped over several lines, none cut
    assert "run cancelled: The run was cancelled." in final


def test_a_failed_steps_reason_is_printed_once():
    out = io.StringIO()
    view = PlainRenderer(TRACE, out)
    view.handle(event(1, "run_started", steps=["a"]))
    view.handle(event(2, "step_started", step_id="a"))
    view.handle(event(3, "step_failed", step_id="a", error="The model does not exist"))
    view.handle(event(4, "run_failed", status="failed", failed_step="a",
                      error="Step 'a' failed: The model does not exist"))
    lines = out.getvalue().splitlines()
    assert out.getvalue().count("does not exist") == 1
    assert lines[-1] == "run failed"
    assert view.outcome.error_shown


def test_an_interrupted_runs_reason_is_on_the_last_line():
    out = io.StringIO()
    view = PlainRenderer(TRACE, out)
    view.handle(event(1, "run_started", steps=["a"]))
    view.handle(event(2, "run_failed", status="interrupted", reason="The server stopped."))
    assert out.getvalue().splitlines()[-1] == "run interrupted: The server stopped."


def test_a_foreach_is_one_panel_counting_its_items():
    view, screen = live(width=80)
    view.handle(event(1, "run_started", steps=["m"]))
    view.handle(event(2, "step_started", step_id="m", path="m", items=300))
    seq = 3
    for n in range(300):
        view.handle(event(seq, "step_started", step_id="m", path=f"m[{n}]"))
        seq += 1
        if n < 290:
            view.handle(event(seq, "step_finished", step_id="m", path=f"m[{n}]", output=f"out {n}"))
            seq += 1
    view.handle(event(seq, "step_failed", step_id="m", path="m[295]", error="provider said no"))
    view.handle(event(seq + 1, "token", step_id="m", path="m[291]", text="half an answer"))
    shown = text_of(view.view(tail=12), width=80)
    assert "300 items: 1 failed, 9 running, 290 succeeded" in shown
    assert "m[291] · running: half an answer" in shown
    assert "m[295] · failed: provider said no" in shown
    assert "… 4 more" in shown
    assert "out 17" not in shown  # finished items are counted, not listed
    assert len(shown.splitlines()) < 20
    view.close()


def test_plain_lines_name_instances_by_path():
    out = io.StringIO()
    view = PlainRenderer(TRACE, out)
    view.handle(event(1, "step_started", step_id="draft", path="improve#2.draft"))
    view.handle(event(2, "step_finished", step_id="draft", path="improve#2.draft", output="v2"))
    assert out.getvalue().splitlines() == ["[improve#2.draft] started", "[improve#2.draft] finished", "    v2"]


def test_a_forks_reused_item_names_where_it_came_from():
    out = io.StringIO()
    view = PlainRenderer(TRACE, out)
    view.handle(event(1, "step_reused", step_id="each", path="each[0]", output="c", source_path="each[2]"))
    view.handle(event(2, "step_reused", step_id="each", path="each[1]", output="b"))
    view.handle(event(3, "step_reused", step_id="plan", path="plan", output="p", overridden=True))
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line.startswith("[")] == [
        "[each[0]] reused from each[2]", "[each[1]] reused", "[plan] set by the fork"]
