"""Instance paths and the template walk (SPEC §8), on their own."""

from __future__ import annotations

import pytest

from orchestra.engine import instances
from orchestra.language import shape


def test_paths_build_and_parse():
    item = instances.item_path("research", 3)
    inner = instances.inside(item) + "improve"
    draft = instances.inside(instances.iteration_path(inner, 1)) + "draft"
    assert (item, draft) == ("research[3]", "research[3].improve#1.draft")
    assert instances.parse(draft) == [
        instances.Segment("research", item=3), instances.Segment("improve", iteration=1),
        instances.Segment("draft")]
    for bad in ("", "a..b", "a[x]", "a#", "a b"):
        with pytest.raises(ValueError):
            instances.parse(bad)


def test_walk_and_nesting_see_inner_steps():
    leaf = {"id": "d", "agent": {"human": True}, "prompt": "p"}
    loop = {"id": "l", "loop": {"steps": [leaf], "until": "true", "max_iterations": 2}}
    each = {"id": "e", "foreach": {"items": "input"}, "steps": [loop]}
    walked = [(s["id"], depth, where) for s, depth, where in shape.walk([each])]
    assert walked == [("e", 0, "steps.0"), ("l", 1, "steps.0.steps.0"),
                      ("d", 2, "steps.0.steps.0.loop.steps.0")]
    assert [shape.nesting(s) for s in (leaf, loop, each)] == [0, 1, 2]
    assert shape.kind_of(each) == "foreach" and shape.kind_of(loop) == "loop"


def test_finished_records_answer_by_path():
    finished = instances.Finished()
    finished.set("m[0]", "succeeded", "a")
    finished.set("m[1]", "failed")
    assert finished.succeeded("m[0]") and not finished.succeeded("m[1]")
    assert not finished.succeeded("m[2]") and finished.output("m[0]") == "a"
    assert sorted(finished.under("m[")) == ["m[0]", "m[1]"]
