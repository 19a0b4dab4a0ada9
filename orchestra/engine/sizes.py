"""Size bounds on what a step renders and stores (SPEC §15), counted in UTF-8 bytes.

A rendered prompt is at most `ORCHESTRA_PROMPT_MAX_BYTES`, a step's output at most
`ORCHESTRA_STEP_OUTPUT_MAX_BYTES`. A prompt is checked before any event carries it, and
it is rendered one placeholder at a time, measured as it grows: a template that would
render to gigabytes (`{{input}}` a hundred times over a large input) stops at the limit
instead of first building the whole text in memory.
"""

from __future__ import annotations

import json
from typing import Any

from orchestra.engine.live import StepFailure
from orchestra.engine.tools.base import ToolError
from orchestra.errors import PayloadTooLargeError
from orchestra.language.expressions import PLACEHOLDER, Scope, render

PROMPT_SETTING = "ORCHESTRA_PROMPT_MAX_BYTES"
OUTPUT_SETTING = "ORCHESTRA_STEP_OUTPUT_MAX_BYTES"


def utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8 (a lone surrogate, possible in JSON input, counts 3)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def prompt_too_large(where: str, size: int, limit: int) -> StepFailure:
    """The failure of a step whose prompt passed the limit; `size` is what was measured
    when rendering stopped (a lower bound of the whole)."""
    return StepFailure(
        f"The rendered prompt of step '{where}' passed the limit of {limit} bytes "
        f"({PROMPT_SETTING}): it reached {size} bytes."
    )


async def render_bounded(template: str, scope: Scope, *, limit: int, where: str) -> str:
    """`template` rendered as `render` does, or StepFailure naming `where` (the step's
    path) once the text passes `limit` UTF-8 bytes. Each placeholder is rendered on its
    own (the same expression once: evaluation has no side effects) and the text is
    joined only when it fits."""
    pieces: list[str] = []
    seen: dict[str, str] = {}
    size, end = 0, 0
    for match in PLACEHOLDER.finditer(template):
        literal, source = template[end:match.start()], match.group(0)
        value = seen.get(source)
        if value is None:
            value = seen[source] = await render(source, scope)
        size += utf8_size(literal) + utf8_size(value)
        if size > limit:
            raise prompt_too_large(where, size, limit)
        pieces += (literal, value)
        end = match.end()
    size += utf8_size(template[end:])
    if size > limit:
        raise prompt_too_large(where, size, limit)
    pieces.append(template[end:])
    return "".join(pieces)


def json_size(value: Any, limit: int) -> int:
    """UTF-8 bytes of `value` as compact JSON, counted only until past `limit` (then the
    count so far, above it): a large list or map is not serialised whole to learn that it
    is too large."""
    if isinstance(value, list):
        total = 1  # [ … and ] or a comma for each item
        for item in value:
            total += 1 + json_size(item, limit - total)
            if total > limit:
                break
        return total + (not value)
    if isinstance(value, dict):
        total = 1  # { … and } or a comma for each member
        for key, item in value.items():
            total += 1 + json_size(str(key), limit) + 1  # "key":
            total += json_size(item, limit - total)
            if total > limit:
                break
        return total + (not value)
    return utf8_size(json.dumps(value, ensure_ascii=False))


def check_output(output: Any, *, limit: int, of: str) -> None:
    """A value computed by an expression (a container's or an item's output, the run's
    `output`) is stored as a step's output is: bounded the same way. `of` names it
    (`step 'research'`, `the template`)."""
    size = json_size(output, limit)
    if size > limit:
        raise StepFailure(f"The output of {of} passed the limit of {limit} bytes "
                          f"({OUTPUT_SETTING}): it reached {size} bytes.")


def check_question(question: str, *, limit: int) -> None:
    """An `ask_user` question (the model's text) is a prompt too, bounded the same way;
    past it the model is told (a tool error) and nothing is asked."""
    size = utf8_size(question)
    if size > limit:
        raise ToolError(f"The question is {size} bytes, over the limit of {limit} bytes "
                        f"({PROMPT_SETTING}); ask a shorter one.")


def check_reply_size(content: Any, *, limit: int) -> None:
    """A human reply becomes the step's output: past the output bound it is refused
    (413, the question stays open) rather than stored."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    size = utf8_size(text)
    if size > limit:
        raise PayloadTooLargeError(
            f"The reply is {size} bytes, over the limit of a step's output of {limit} bytes "
            f"({OUTPUT_SETTING})."
        )
