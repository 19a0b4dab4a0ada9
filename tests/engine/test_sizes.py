"""`orchestra.engine.sizes`: bounded rendering gives what `render` gives, and sizes are
UTF-8 bytes of compact JSON."""

from __future__ import annotations

import json

import pytest

from orchestra.engine.live import StepFailure
from orchestra.engine.sizes import json_size, render_bounded
from orchestra.language.expressions import Scope, render

SCOPE = {"input": {"name": "Zoë", "tags": ["a", "b"]},
         "steps": {"draft-1": {"output": "text", "status": "succeeded"}}}


@pytest.mark.parametrize("template", [
    "no placeholder", "{{input}}", "{{ input.name }} / {{input.name}} / {{ input.name }}",
    "{{ steps.draft-1.output }}!", "tags: {{ input.tags.size() }} {{ input.tags }}", "{{input}}{{input}}",
    "a {{ 'x' + input.name }}\n{{  input.tags[1] }} end",
])
async def test_bounded_rendering_is_rendering(template):
    assert await render_bounded(template, Scope(SCOPE), limit=10_000, where="s") == await render(template, Scope(SCOPE))


async def test_rendering_stops_at_the_first_placeholder_past_the_limit():
    scope = Scope({"input": "é" * 100})  # 200 bytes
    with pytest.raises(StepFailure) as failed:
        await render_bounded("{{input}}" * 1000, scope, limit=500, where="x[2]")
    assert failed.value.message == ("The rendered prompt of step 'x[2]' passed the limit of 500 "
                                    "bytes (ORCHESTRA_PROMPT_MAX_BYTES): it reached 600 bytes.")
    assert await render_bounded("{{input}}" * 2, scope, limit=400, where="x") == "é" * 200


@pytest.mark.parametrize("value", [
    {"a": [1, "é", None, {"b": True}]}, [], {}, "x\n\"", [1.5, 2, False], {"k": {"z": []}}, "\ud800",
])
def test_json_size_is_the_compact_json_bytes(value):
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert json_size(value, 10**9) == len(text.encode("utf-8", "surrogatepass"))


def test_json_size_stops_past_the_limit():
    assert 100 < json_size(["x" * 60] * 10**6, 100) < 200  # not a million items counted
