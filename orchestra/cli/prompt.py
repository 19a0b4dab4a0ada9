"""Questions of a watched run, answered at the terminal without ever blocking the stream.

The run's events are read on a background thread (`EventPump`), so while a question
waits at the prompt the view still learns what happens. The prompt reads the terminal
line by line with a timeout (`select`), and is withdrawn, with a line saying why, when
the question is answered elsewhere (another terminal, the web console), its step ends,
or the run ends (cancelled, failed). Whatever was typed but not sent is discarded, and
the message says so: nothing typed is ever dropped silently.
"""

from __future__ import annotations

import os
import queue
import select
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestra.cli.answer_shape import expected_answer
from orchestra.vocabulary import EventKind, RunStatus

if TYPE_CHECKING:
    from orchestra.client import Event

_END = object()


class EventPump:
    """Iterates `events` on a daemon thread; iterate the pump to get them (errors too)."""

    def __init__(self, events: Iterable[Event]) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._held: deque = deque()  # events looked at during a prompt, not yet handled
        self.ended = False
        threading.Thread(target=self._run, args=(events,), daemon=True, name="orchestra-events").start()

    def _run(self, events: Iterable[Event]) -> None:
        try:
            for event in events:
                self._queue.put(event)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
            self._queue.put(exc)
        self._queue.put(_END)

    def _take(self, item: object) -> Event | None:
        if item is _END:
            self.ended = True
            return None
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[return-value]

    def __iter__(self) -> Iterator[Event]:
        while True:
            if self._held:
                yield self._held.popleft()
                continue
            if self.ended:
                return
            event = self._take(self._queue.get())
            if event is not None:
                yield event

    def upcoming(self) -> list[Event]:
        """Events already received but not yet handled by the main loop."""
        return list(self._held)

    def peek_new(self) -> list[Event]:
        """Events that arrived since the last look, kept for the main loop to handle."""
        arrived = []
        while not self.ended:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            try:
                event = self._take(item)
            except BaseException:
                self._queue.put(item)  # the main loop raises it in turn
                break
            if event is not None:
                arrived.append(event)
                self._held.append(event)
        return arrived


class Unanswerable(Exception):
    """Raised by `ask`'s `send` when no answer would be taken (nothing waits for one)."""


@dataclass
class Question:
    request_id: str | None
    step_id: str | None
    prompt: str
    schema: Any = None  # the answer's JSON Schema; None: plain text
    asked_on: str | None = None  # the run that asks it: the watched one, or its child run

    @classmethod
    def of(cls, event: Event, trace_id: str | None = None) -> Question:
        data = event.data
        return cls(data.get("request_id"), data.get("step_id"), str(data.get("prompt") or ""),
                   data.get("schema"), data.get("child_trace_id") or trace_id)

    def reply_hint(self) -> str:
        """The command that answers it later, from any terminal."""
        request = f" --request-id {self.request_id}" if self.request_id else ""
        return f"orchestra workflow reply {self.asked_on or 'TRACE_ID'} 'YOUR ANSWER'{request}"

    def settled_by(self, event: Event) -> str | None:
        """Why `event` makes this question moot, or None."""
        if event.terminal:
            status = event.data.get("status") or {EventKind.RUN_FINISHED: RunStatus.SUCCEEDED}.get(event.kind, "ended")
            return f"the run {'was ' if status == RunStatus.CANCELLED else 'is '}{status}"
        same_step = self.step_id is not None and event.data.get("step_id") == self.step_id
        answered = (self.request_id and event.data.get("request_id") == self.request_id) or (
            not self.request_id and same_step)
        if event.kind == EventKind.REPLY_RECEIVED and answered:
            return "it was answered elsewhere"
        if event.kind in (EventKind.STEP_FINISHED, EventKind.STEP_FAILED) and same_step:
            return "its step has ended"
        return None


def read_line(fd: int, timeout: float) -> str | None:
    """One line typed at the terminal (canonical mode: the kernel hands over whole lines),
    or None when nothing was entered within `timeout`. EOF (Ctrl-D) is ''."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return None
    data = os.read(fd, 65536)
    if not data:
        return ""
    return data.decode("utf-8", "replace").rstrip("\r\n") or "\n"


def _entered(line: str, send: Callable[[str], str | None], say: Callable[..., None],
             refused: list[str], left_open: str) -> tuple[bool, str | None]:
    """One entered line at the prompt: (whether the prompt ends, the note it leaves)."""
    if line == "\n" and refused:  # Enter alone after a refusal: leave it open
        return True, left_open
    if line == "\n":  # an empty line: ask again rather than send nothing
        say("your answer (empty lines are not sent): ", end="")
        return False, None
    try:
        refusal = send(line)
    except Unanswerable as exc:
        return True, f"not taken: {exc}; {left_open}"
    if not refusal:
        return True, None
    refused.append(refusal)
    say(f"not taken: {refusal}")
    say("type another answer, or Enter alone to leave the question open; your answer: ", end="")
    return False, None


def discard_typed(fd: int) -> None:
    """Drop what was typed but not yet entered (it would otherwise reach the shell later)."""
    try:
        import termios

        termios.tcflush(fd, termios.TCIFLUSH)
    except (ImportError, OSError):
        pass


class PromptArea:
    """Writes a prompt's lines and counts the terminal rows they take, with the echo of
    what is typed, so that the live view can take them away when it goes on."""

    def __init__(self, write: Callable[[str], None], width: int) -> None:
        self.write, self.width = write, max(width, 1)
        self.rows = 0  # line breaks (and wraps) since the prompt began
        self.column = 0

    def _count(self, text: str) -> None:
        for char in text:
            if char == "\n":
                self.rows, self.column = self.rows + 1, 0
                continue
            if self.column == self.width:  # the terminal wraps before the next character
                self.rows, self.column = self.rows + 1, 0
            self.column += 1

    def say(self, text: str, end: str = "\n") -> None:
        self.write(text + end)
        self._count(text + end)

    def typed(self, line: str) -> None:
        """The terminal's echo of an entered line (and of its Enter)."""
        self._count(line + "\n")


def ask(question: Question, pump: EventPump, send: Callable[[str], str | None], say: Callable[..., None],
        *, typed: Callable[[str], None] = lambda line: None, fd: int | None = None,
        poll: float = 0.1) -> str | None:
    """Put `question` at the prompt until it is answered here (sent with `send`, which
    returns a refusal message or None) or settled elsewhere (then the prompt is withdrawn).

    The question itself is already on screen (the live view's panel shows it), so the
    prompt only asks for the answer, after the expected shape when the answer is JSON. A
    refused answer is said in one line and the prompt asks again at once: the terminal
    is never left without a prompt while the question is open. After a refusal an empty
    line (as Ctrl-D always) leaves the question open and the prompt; when `send` raises
    `Unanswerable` (nothing waits for an answer) the prompt is left at once. Returns the line worth
    keeping on screen once the prompt is gone (a withdrawal, no answer), or None when
    the answer was sent.
    """
    fd = sys.stdin.fileno() if fd is None else fd
    if any(question.settled_by(event) for event in pump.upcoming()):
        return None  # settled before its turn came: nothing to ask
    for line in expected_answer(question.schema):
        say(line)
    say(f"{question.step_id or 'run'} asks the question above; your answer: ", end="")
    left_open = f"no answer sent; the question stays open: answer with {question.reply_hint()}"
    refused: list[str] = []  # the refusals so far: after one, Enter alone leaves
    while True:
        line = read_line(fd, poll)
        if line == "":  # Ctrl-D: leave the question open
            return left_open
        if line is not None:
            typed("" if line == "\n" else line)
            done, note = _entered(line, send, say, refused, left_open)
            if done:
                return note
            continue
        for event in pump.peek_new():
            reason = question.settled_by(event)
            if reason:
                discard_typed(fd)
                return f"prompt withdrawn: {reason}; anything typed here was not sent"
        if pump.ended:
            discard_typed(fd)
            return "prompt withdrawn: the event stream ended; anything typed here was not sent"
