"""Rendering a run's events in the terminal: a live rich view, plain lines, or JSON lines.

`make_renderer` picks one: `--json` → one raw event object per line; a terminal →
`LiveRenderer` (a panel per step with streamed tokens, tool calls and results; long
lines wrap at the terminal's width; a foreach or loop is one panel that counts its
items or iterations and shows only those running or failed); anything else →
`PlainRenderer` (one readable line per happening, each step's output when it finishes).
Steps are keyed by instance `path` (`research[3]`, `improve#2.draft`; SPEC §8). All of them record the run's final
status in `outcome`. Questions are put at the prompt by `orchestra.cli.prompt`.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console, Group
from rich.control import Control
from rich.live import Live
from rich.panel import Panel
from rich.segment import ControlType, Segment, Segments
from rich.style import Style
from rich.text import Text

from orchestra.timestamps import parse_ts
from orchestra.vocabulary import EventKind, RunStatus, StepStatus

if TYPE_CHECKING:
    from orchestra.client import Event


def _pick(data: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if data.get(name) is not None:
            return data[name]
    return default


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def top_of(path: str) -> str:
    """The top-level step an instance belongs to: `research[3].fetch` → `research`."""
    head = path.split(".", 1)[0]
    return head.split("[", 1)[0].split("#", 1)[0]


def _seconds(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return ""
    return f" in {max(end - start, 0.0):.1f}s"


@dataclass
class StepView:
    """What has been seen of one step."""

    step_id: str
    status: str = StepStatus.RUNNING
    text: str = ""  # every streamed token
    parts: list[list[str]] = field(default_factory=list)  # [kind, text] in arrival order
    output: str | None = None
    error: str | None = None
    started: float | None = None
    finished: float | None = None
    cost: str | None = None  # step_finished's cost_usd (SPEC §12)

    def add(self, kind: str, text: str) -> None:
        """Append to the view; streamed text joins the text part before it."""
        if kind == "text" and self.parts and self.parts[-1][0] == "text":
            self.parts[-1][1] += text
        else:
            self.parts.append([kind, text])


@dataclass
class Outcome:
    """How the run ended (status None while it has not)."""

    status: str | None = None
    error: str | None = None
    started: float | None = None
    finished: float | None = None
    error_shown: bool = False  # the reason was already shown with the failed step
    output: Any = None  # the run's output (run_finished), shown under the last line

    @property
    def ok(self) -> bool:
        return self.status == RunStatus.SUCCEEDED


class Renderer:
    """Folds events into step views; subclasses show them."""

    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id
        self.steps: dict[str, StepView] = {}
        self.outcome = Outcome()

    def __enter__(self) -> Renderer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish the display (subclasses)."""

    def step(self, step_id: str | None) -> StepView:
        key = step_id or "run"
        if key not in self.steps:
            self.steps[key] = StepView(key)
        return self.steps[key]

    def handle(self, event: Event) -> None:
        """Update the state from one event, then show it."""
        data, kind = event.data, event.kind
        ts = parse_ts(data.get("ts"))
        key = data.get("path") or data.get("step_id")
        step = self.step(key) if key else None
        if kind == EventKind.RUN_STARTED:
            self.outcome.started = ts
        elif step and kind in _STEP_EVENTS:
            _step_event(step, kind, data, ts)
        elif event.terminal:
            self._run_ended(kind, data, ts)
        self.show(event)

    def _run_ended(self, kind: str, data: dict, ts) -> None:
        """A terminal event: the run's outcome, and no step left looking as if still going."""
        self.outcome.finished = ts
        default = {EventKind.RUN_FINISHED: RunStatus.SUCCEEDED,
                   EventKind.RUN_FAILED: RunStatus.FAILED}.get(kind, RunStatus.CANCELLED)
        self.outcome.status = str(data.get("status") or default)
        error = _pick(data, "error", "message", "reason")
        self.outcome.error = _text(error) if error is not None else None
        failed = self.steps.get(str(data.get("failed_step"))) if data.get("failed_step") else None
        self.outcome.error_shown = bool(failed and failed.error)
        if kind == EventKind.RUN_FINISHED:
            self.outcome.output = data.get("output")
        stopped = (StepStatus.INTERRUPTED if self.outcome.status == RunStatus.INTERRUPTED
                   else StepStatus.CANCELLED)
        for open_step in self.steps.values():  # a step the run left behind is not still going
            if open_step.status in (StepStatus.RUNNING, StepStatus.WAITING_REPLY):
                open_step.status, open_step.finished = stopped, ts

    def show(self, event: Event) -> None:
        """Display one event (subclasses)."""


SKIP_REASONS = {"when": "skipped: its `when` was false",
                "dependencies": "skipped: every step it depends on was skipped"}


def reused_text(data: dict[str, Any]) -> str:
    """What a fork's `step_reused` says: set by the fork, or reused (from the source's
    instance at another path, when an item moved in its list)."""
    if data.get("overridden"):
        return "set by the fork"
    return f"reused from {data['source_path']}" if data.get("source_path") else "reused"


def retry_text(data: dict[str, Any]) -> str:
    """`attempt 1 failed, trying again in 2s: <error>`."""
    delay = data.get("delay_seconds")
    wait = f" in {float(delay):.0f}s" if isinstance(delay, (int, float)) else ""
    return f"attempt {data.get('attempt', '?')} failed, trying again{wait}: {_text(data.get('error') or '')}"


def output_lines(outcome: Outcome, width: int | None = None) -> list[str]:
    """The run's output above its last line: `output:` then the value, indented."""
    if not outcome.ok or outcome.output is None:
        return []
    return ["output:", *indented(_text(outcome.output), width)]


def indented(text: str, width: int | None, indent: str = "    ") -> list[str]:
    """`text` under `indent`, line by line; with a width, a longer line is wrapped at
    spaces and each piece keeps the indent (and the line's own leading spaces), so a
    long answer reads as a block rather than running back to the left margin."""
    out: list[str] = []
    for line in text.splitlines() or [""]:
        lead = indent + line[:len(line) - len(line.lstrip())]
        if width is None or len(indent) + len(line) <= width or width - len(lead) < 20:
            out.append(indent + line)
            continue
        out += textwrap.wrap(line.strip(), width, initial_indent=lead, subsequent_indent=lead,
                             break_long_words=False, break_on_hyphens=False) or [indent + line]
    return out


def plain_width() -> int | None:
    """The width piped lines are wrapped at: $COLUMNS, else the width of a terminal the
    command still writes to or reads from (`| tee log` keeps stderr and stdin on the
    terminal); None (no wrapping) when there is no terminal at all, e.g. a cron job's log."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for stream in (sys.stderr, sys.stdin):
        try:
            if stream is not None and stream.isatty():
                return os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError):
            continue
    return None


def tool_call_text(data: dict[str, Any]) -> str:
    name = _pick(data, "tool", "name", default="tool")
    args = _pick(data, "arguments", "args", "input", default={})
    return f"{name}({_text(args)})"


def tool_result_text(data: dict[str, Any]) -> str:
    name = _pick(data, "tool", "name", default="tool")
    if data.get("error"):
        return f"{name} error: {_text(data['error'])}"
    return f"{name}: {_text(_pick(data, 'result', 'output', 'content', default=''))}"


class JsonRenderer(Renderer):
    """One raw event per line: `{"id": seq, "event": kind, "data": {...}}`."""

    def __init__(self, trace_id: str, stream: TextIO | None = None) -> None:
        super().__init__(trace_id)
        self.stream = stream or sys.stdout

    def show(self, event: Event) -> None:
        self.stream.write(json.dumps(event.to_json(), ensure_ascii=False) + "\n")
        self.stream.flush()


class PlainRenderer(Renderer):
    """Readable lines for pipes and logs; a step's output is printed when it finishes."""

    def __init__(self, trace_id: str, stream: TextIO | None = None, *, hint: bool = True,
                 width: int | None = None) -> None:
        super().__init__(trace_id)
        self.stream = stream or sys.stdout
        self.hint = hint  # say how to answer a question (not in a replay: it was answered)
        self.width = width  # outputs' lines are wrapped at it, keeping their indent

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def show(self, event: Event) -> None:
        data, kind = event.data, event.kind
        sid = data.get("path") or data.get("step_id")
        if kind == EventKind.RUN_STARTED:
            self._line(_started_line(self.trace_id, data))
        elif kind in _PLAIN_LINES:
            self._line(f"[{sid}] {_PLAIN_LINES[kind](data)}")
        elif kind == EventKind.REPLY_REQUESTED:
            self._question(sid, data)
        elif kind in (EventKind.STEP_FINISHED, EventKind.STEP_FAILED, EventKind.STEP_SKIPPED):
            step = self.steps.get(sid) if sid else None
            if step:
                self._step_ended(kind, sid, step)
        elif kind in (EventKind.BUDGET_EXCEEDED, EventKind.BUDGET_EXHAUSTED):
            self._line(budget_line(self.trace_id, kind, data))
        elif event.terminal:
            for line in output_lines(self.outcome, self.width):
                self._line(line)
            self._line(final_line(self.outcome))

    def _question(self, sid: str, data: dict) -> None:
        request_id = data.get("request_id")
        self._line(f"[{sid}] question: {_text(data.get('prompt'))}")
        if self.hint:
            asked_on = data.get("child_trace_id") or self.trace_id  # a child's question: on its trace
            hint = f"orchestra workflow reply {asked_on} 'YOUR ANSWER'"
            self._line(f"[{sid}]   answer with: {hint}" + (f" --request-id {request_id}" if request_id else ""))

    def _step_ended(self, kind: str, sid: str, step: StepView) -> None:
        if kind == EventKind.STEP_FINISHED:
            self._line(f"[{sid}] finished{_seconds(step.started, step.finished)}{_cost(step.cost)}")
            for line in indented(step.output or "", self.width):
                self._line(line)
        elif kind == EventKind.STEP_FAILED:
            self._line(f"[{sid}] failed{_seconds(step.started, step.finished)}: {step.error}")
        else:  # skipped: the reason, as the state holds it
            self._line(f"[{sid}] {step.parts[0][1]}")


def _cost(cost: str | None) -> str:
    return f" · ${cost}" if cost else ""


def budget_line(trace_id: str, kind: str, data: dict) -> str:
    """The budget stopped the run: what was spent of what, what the next call may cost,
    and how to go on if it waits (a top-up of at least what that call lacks)."""
    spent = f"${data.get('spent_usd')} of ${data.get('budget_usd')}"
    add = "0.50"
    if isinstance(data.get("next_call_usd"), str):
        spent += f"; the next call may cost up to ${data['next_call_usd']}"
        add = top_up_hint(data)
    if kind == EventKind.BUDGET_EXHAUSTED:
        return (f"budget exhausted ({spent}): the run waits; raise it with "
                f"orchestra workflow budget {trace_id} --add {add}")
    return f"budget exceeded ({spent}): the next model call was not made"


def top_up_hint(data: dict) -> str:
    """What the next call lacks (its worst case less what is left), rounded up to a cent."""
    try:
        lacks = Decimal(data["next_call_usd"]) - (Decimal(data["budget_usd"]) - Decimal(data["spent_usd"]))
    except (KeyError, TypeError, ArithmeticError):
        return "0.50"
    return str(max(lacks, Decimal("0.01")).quantize(Decimal("0.01"), rounding=ROUND_CEILING))


def final_line(outcome: Outcome) -> str:
    """`run failed in 1.2s`, with the reason unless the failed step already showed it."""
    took = _seconds(outcome.started, outcome.finished)
    text = f"run {outcome.status}{took}"
    if outcome.error and not outcome.ok and not outcome.error_shown:
        text += f": {outcome.error}"
    return text


_STYLE = {StepStatus.RUNNING: "cyan", StepStatus.WAITING_REPLY: "yellow", StepStatus.SUCCEEDED: "green",
          StepStatus.FAILED: "red", StepStatus.CANCELLED: "magenta", StepStatus.INTERRUPTED: "magenta",
          StepStatus.SKIPPED: "dim"}


class LiveRenderer(Renderer):
    """A live rich view: one panel per step, text wrapped at the terminal's width.

    A step that has shown nothing yet says what it waits for, with the seconds so far,
    so a slow first answer never looks like a blank panel. `pause()`/`resume()` hand the
    terminal to a prompt.
    """

    TAIL = 12  # lines of streamed text shown while live; the full text at the end

    def __init__(self, trace_id: str, console: Console) -> None:
        super().__init__(trace_id)
        # The shared console soft-wraps (no cutting of piped output); on a terminal the
        # view must wrap at the width instead, so it gets a console of its own.
        # An explicit width (tests) is kept; otherwise rich follows the terminal's size.
        self.console = Console(file=console.file, soft_wrap=False, force_terminal=console.is_terminal,
                               width=getattr(console, "_width", None))
        self.opened = time.time()
        self.live = Live(console=self.console, refresh_per_second=12, transient=True,
                         get_renderable=lambda: self.view(tail=self.TAIL))
        self.live.start()

    def panel(self, step: StepView, tail: int | None) -> Panel:
        lines: list[tuple[str, str]] = []
        for kind, text in list(step.parts):
            style = {"tool": "dim", "ask": "bold yellow", "note": "dim italic"}.get(kind, "")
            lines += [(line, style) for line in text.strip("\n").splitlines()]
        if tail is not None and len(lines) > tail:
            lines = [("…", "dim")] + lines[-tail:]
        body = Text()
        for i, (line, style) in enumerate(lines):
            body.append(("\n" if i else "") + line, style=style)
        if step.error:
            body.append(("\n" if body.plain else "") + step.error, style="red")
        if not body.plain and step.status == StepStatus.RUNNING:
            since = step.started or self.opened
            body.append(f"waiting for the agent… {max(time.time() - since, 0.0):.0f}s", style="dim italic")
        title = f"[b]{step.step_id}[/] · {step.status}{_seconds(step.started, step.finished)}{_cost(step.cost)}"
        return Panel(body, title=title, title_align="left", border_style=_STYLE.get(step.status, "white"))

    SHOWN = 6  # instances of one container listed at once: a few failed, then running ones

    def group(self, top: StepView, members: list[StepView], tail: int | None) -> Panel:
        """A container's panel: counts of its instances by status, then the few running
        or failed ones (a 1,000-item foreach stays one readable panel)."""
        direct = [m for m in members if "." not in m.step_id]  # items or iterations
        parents = {m.step_id.rsplit(".", 1)[0] for m in members if "." in m.step_id}
        leaves = [m for m in members if m.step_id not in parents]  # the calls themselves
        counts: dict[str, int] = {}
        for member in direct:
            counts[member.status] = counts.get(member.status, 0) + 1
        noun = "iterations" if direct and "#" in direct[0].step_id else "items"
        body = Text(f"{len(direct)} {noun}: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
                    if direct else "starting…", style="dim")
        busy = [m for m in leaves if m.status in (StepStatus.RUNNING, StepStatus.WAITING_REPLY)]
        failed = [m for m in leaves if m.status == StepStatus.FAILED]
        picked = failed[: self.SHOWN // 2]
        picked += busy[: self.SHOWN - len(picked)]
        for member in picked:
            asked = [text for kind, text in member.parts if kind == "ask"]
            if member.status == StepStatus.WAITING_REPLY and asked:  # the whole question: what it asks about
                line = asked[-1]
            else:
                line = (member.error if member.status == StepStatus.FAILED else
                        (member.text.strip().splitlines() or [""])[-1])
            body.append(f"\n{member.step_id} · {member.status}: ", style=_STYLE.get(member.status, ""))
            body.append(line or "…", style="bold yellow" if member.status == StepStatus.WAITING_REPLY else "")
        if len(busy) + len(failed) > len(picked):
            body.append(f"\n… {len(busy) + len(failed) - len(picked)} more", style="dim")
        if top.output is not None and top.status != StepStatus.RUNNING:
            body.append("\n" + (top.output if tail is None else top.output[-300:]))
        if top.error:
            body.append("\n" + top.error, style="red")
        title = f"[b]{top.step_id}[/] · {top.status}{_seconds(top.started, top.finished)}"
        return Panel(body, title=title, title_align="left", border_style=_STYLE.get(top.status, "white"))

    def view(self, tail: int | None = None) -> Group:
        parts: list[Any] = [Text(f"run {self.trace_id}", style="bold")]
        if not self.steps and not self.outcome.status:
            parts.append(Text(f"waiting for the run to start… {max(time.time() - self.opened, 0.0):.0f}s",
                              style="dim italic"))
        grouped: dict[str, list[StepView]] = {}
        for step in list(self.steps.values()):  # the refresh thread reads too
            grouped.setdefault(top_of(step.step_id), []).append(step)
        for name, members in grouped.items():
            top = self.steps.get(name)
            if top is not None and len(members) == 1:
                parts.append(self.panel(top, tail))
            else:
                parts.append(self.group(top or StepView(name), [m for m in members if m is not top], tail))
        if self.outcome.status:
            if tail is None:  # the run's output at the end, in full, above the last line
                parts.extend(Text(line) for line in output_lines(self.outcome))
            parts.append(Text(final_line(self.outcome), style="green" if self.outcome.ok else "red"))
        return Group(*parts)

    def show(self, event: Event) -> None:
        if self.live.is_started:
            self.live.refresh()

    def pause(self) -> None:
        """Hand the terminal to a prompt: the live view is replaced by a still copy of it
        (its last lines, so the question stays in sight, cut to leave room for the
        prompt below), whose height `resume` needs to take it away again."""
        self.live.stop()  # transient: the live copy is erased
        self.live.vertical_overflow = "ellipsis"  # stop() leaves it "visible"
        options = self.console.options
        lines = self.console.render_lines(self.view(tail=self.TAIL), options, pad=False)
        room = max(self.console.height - 4, 3)
        if len(lines) > room:
            lines = [[Segment("…", Style(dim=True))]] + lines[-(room - 1):]
        self.console.print(Segments([seg for line in lines for seg in (*line, Segment.line())]), end="")
        self.still_lines = len(lines)

    def resume(self, prompt_lines: int = 0, note: str | None = None) -> None:
        """Take away the still copy and the `prompt_lines` written under it, leave `note`
        (why the prompt ended, when it matters) in their place, and go live again: the
        screen holds one copy of the view, never the old one above a new one."""
        rows = getattr(self, "still_lines", 0) + prompt_lines
        self.console.control(Control(ControlType.CARRIAGE_RETURN, (ControlType.ERASE_IN_LINE, 2),
                                     *((ControlType.CURSOR_UP, 1), (ControlType.ERASE_IN_LINE, 2)) * rows))
        self.still_lines = 0
        if note:
            self.console.print(Text(note, style="yellow"), soft_wrap=True)  # one line, as typed
        self.live.start(refresh=True)

    def close(self) -> None:
        self.live.stop()
        self.console.print(self.view())


def make_renderer(trace_id: str, *, json_lines: bool, console: Console, replay: bool = False) -> Renderer:
    """JSON lines when asked, the live view on a terminal, plain lines otherwise."""
    if json_lines:
        return JsonRenderer(trace_id)
    if console.is_terminal:
        return LiveRenderer(trace_id, console)
    return PlainRenderer(trace_id, hint=not replay, width=plain_width())


_STEP_EVENTS = frozenset({
    EventKind.STEP_STARTED, EventKind.TOKEN, EventKind.TOOL_CALL, EventKind.TOOL_RESULT,
    EventKind.REPLY_REQUESTED, EventKind.REPLY_RECEIVED, EventKind.STEP_FINISHED,
    EventKind.STEP_FAILED, EventKind.STEP_SKIPPED, EventKind.STEP_RETRYING, EventKind.STEP_REUSED,
})


def _step_event(step: StepView, kind: str, data: dict, ts) -> None:
    """One step's event applied to what is shown of that step."""
    if kind == EventKind.STEP_STARTED:
        step.status, step.started = StepStatus.RUNNING, ts
    elif kind == EventKind.TOKEN:
        piece = _text(_pick(data, "text", "delta", "content", "token", default=""))
        step.text += piece
        step.add("text", piece)
    elif kind == EventKind.TOOL_CALL:
        step.add("tool", f"→ {tool_call_text(data)}")
    elif kind == EventKind.TOOL_RESULT:
        step.add("tool", f"← {tool_result_text(data)}")
    elif kind == EventKind.REPLY_REQUESTED:
        step.status = StepStatus.WAITING_REPLY
        step.add("ask", f"? {_text(data.get('prompt'))}")
    elif kind == EventKind.REPLY_RECEIVED:
        step.status = StepStatus.RUNNING
        step.add("ask", f"! {_text(_pick(data, 'content', 'reply', default=''))}")
    elif kind == EventKind.STEP_FINISHED:
        _step_finished(step, data, ts)
    elif kind == EventKind.STEP_FAILED:
        step.status, step.finished = StepStatus.FAILED, ts
        step.error = _text(_pick(data, "error", "message", default="failed"))
    elif kind == EventKind.STEP_SKIPPED:
        step.status, step.started, step.finished = StepStatus.SKIPPED, None, None
        step.parts = [["note", SKIP_REASONS.get(str(data.get("reason")), "skipped")]]
    elif kind == EventKind.STEP_REUSED:  # a fork's copy: no call was made
        step.status, step.finished = StepStatus.SUCCEEDED, ts
        output = data.get("output")
        step.output = _text(output) if output is not None else ""
        step.parts = [["note", reused_text(data)]]
    else:  # STEP_RETRYING
        step.add("note", retry_text(data))


def _step_finished(step: StepView, data: dict, ts) -> None:
    step.status, step.finished = StepStatus.SUCCEEDED, ts
    step.cost = data.get("cost_usd") if isinstance(data.get("cost_usd"), str) else None
    output = _pick(data, "output", "content", "text")
    step.output = _text(output) if output is not None else step.text
    if step.output and not step.parts:  # nothing was shown of it yet
        step.add("text", step.output)


def _started_line(trace_id: str, data: dict) -> str:
    name = _pick(data, "template_name", "template", default="")
    steps = data.get("steps") if isinstance(data.get("steps"), list) else []
    return (f"run {trace_id} started" + (f": {name}" if name else "")
            + (f" (steps: {', '.join(map(str, steps))})" if steps else ""))


# The plain renderer's one-line events: kind -> the line after `[step] `.
_PLAIN_LINES = {
    EventKind.STEP_STARTED: lambda data: "started",
    EventKind.TOOL_CALL: lambda data: f"tool call: {tool_call_text(data)}",
    EventKind.TOOL_RESULT: lambda data: f"tool result: {tool_result_text(data)}",
    EventKind.REPLY_RECEIVED: lambda data: f"reply received: {_text(_pick(data, 'content', 'reply', default=''))}",
    EventKind.STEP_RETRYING: retry_text,
    EventKind.STEP_REUSED: reused_text,
}
