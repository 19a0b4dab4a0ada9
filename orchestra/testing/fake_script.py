"""What the fake model is told to answer: one scripted reply (`ScriptedReply`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

ReplyKind = Literal["text", "tool_calls", "error", "cut"]


@dataclass
class ScriptedReply:
    """One queued answer to a `POST /v1/chat/completions`.

    `text` is streamed in `chunks` pieces (None: one piece per word) with `delay`
    seconds between them, after `initial_delay` before the response starts. For
    `tool_calls`, each entry is `(name, arguments)`; arguments given as a string are
    sent verbatim (to script invalid JSON). `error` answers `status` with `body` and
    `headers`. `cut` sends `cut_after` chunks of the text and then drops the connection
    (or, with `clean_cut`, ends the HTTP body properly but without `finish_reason` and
    `[DONE]`, as a misbehaving proxy might). With `wait_for_requests` N the answer is
    held until the fake has received N chat requests in all (at most 10 s; then it is
    answered 400, which no client retries): a test of concurrency that needs no clock.
    """

    kind: ReplyKind = "text"
    text: str = ""
    chunks: int | None = None
    delay: float = 0.0
    initial_delay: float = 0.0
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int = 1
    clean_cut: bool = False
    finish_reason: str | None = None
    usage: tuple[int, ...] | None = None  # (prompt, completion[, cached])
    wait_for_requests: int = 0


@dataclass
class RecordedRequest:
    """A request the fake received: header names lower-cased, `body` parsed JSON (or None),
    `client_port` the port of the connection that carried it (one per TCP connection)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    client_port: int = 0


def split_text(text: str, chunks: int | None) -> list[str]:
    """Cut `text` into `chunks` contiguous pieces (None: per word, keeping spaces)."""
    if not text:
        return [""]
    if chunks is None:
        return re.findall(r"\s*\S+|\s+$", text) or [text]
    chunks = max(1, min(chunks, len(text)))
    size, extra = divmod(len(text), chunks)
    pieces, start = [], 0
    for i in range(chunks):
        end = start + size + (1 if i < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces
