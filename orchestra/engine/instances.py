"""Step instances (SPEC §8): their paths, and what a run has already finished.

Everything that runs in a run is an *instance* with a path unique in the run:

- a top-level step: `review`;
- a foreach item: `research[3]` (item 3, counted from 0); for a foreach with inner steps
  the item's steps are `research[3].fetch`, `research[3].summarise`;
- a loop iteration: `improve#2` (counted from 1), its steps `improve#2.draft`;
- nested: `research[3].improve#1.draft`.

A container (`research`, `improve`) is an instance too, and so is every item and every
iteration: each is one stored `run_step` row. `Finished` is the run's stored rows read
back; a scheduler asks it, for any path, whether that instance already succeeded and
with what output, so resume, retry and take-over redo only what had not succeeded —
the plan of a run is a pure function of its template and these records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from orchestra.vocabulary import StepStatus

_SEGMENT = re.compile(r"(?P<id>[A-Za-z0-9_-]{1,64})(?:\[(?P<item>\d+)\]|#(?P<iteration>\d+))?")


def item_path(container: str, index: int) -> str:
    """`research[3]`: item `index` (from 0) of the foreach at path `container`."""
    return f"{container}[{index}]"


LABEL_MAX = 40  # characters of an item's label (its `step_started` `item`)
_LABEL_KEYS = ("name", "title", "topic", "label", "id")


def item_label(value: Any) -> str:
    """A short text naming a foreach item by its value, for its `step_started` (`item`):
    a string as it is; of an object, its name, title, topic, label or id, else its first
    text; anything else as compact JSON. Blanks collapsed, at most LABEL_MAX characters."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    elif isinstance(value, dict):
        named = next((value[k] for k in _LABEL_KEYS
                      if isinstance(value.get(k), (str, int, float)) and not isinstance(value.get(k), bool)), None)
        first = next((v for v in value.values() if isinstance(v, str) and v.strip()), None)
        text = str(named) if named is not None else first if first is not None else _compact(value)
    else:
        text = _compact(value)
    text = " ".join(text.split())
    return text if len(text) <= LABEL_MAX else text[:LABEL_MAX - 1] + "…"


def _compact(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)[:1000]
    except (TypeError, ValueError):
        return str(value)[:1000]


def iteration_path(container: str, iteration: int) -> str:
    """`improve#2`: iteration `iteration` (from 1) of the loop at path `container`."""
    return f"{container}#{iteration}"


def inside(path: str) -> str:
    """The prefix of the steps inside an item or an iteration: `research[3].`."""
    return f"{path}."


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of a path: a step id, with the item or iteration it names if any."""

    step_id: str
    item: int | None = None
    iteration: int | None = None


def parse(path: str) -> list[Segment]:
    """`research[3].improve#1.draft` → its segments; ValueError for a malformed path."""
    segments = []
    for part in path.split("."):
        match = _SEGMENT.fullmatch(part)
        if match is None:
            raise ValueError(f"not an instance path: {path!r}")
        item, iteration = match.group("item"), match.group("iteration")
        segments.append(Segment(
            match.group("id"),
            None if item is None else int(item),
            None if iteration is None else int(iteration),
        ))
    return segments


@dataclass(slots=True)
class Record:
    """One stored instance, as far as scheduling needs it."""

    status: str
    output: Any = None


class Finished:
    """The run's stored instances by path: what a resumed or retried run need not redo."""

    __slots__ = ("records",)

    def __init__(self, records: dict[str, Record] | None = None) -> None:
        self.records: dict[str, Record] = records or {}

    def succeeded(self, path: str) -> bool:
        record = self.records.get(path)
        return record is not None and record.status == StepStatus.SUCCEEDED

    def output(self, path: str) -> Any:
        return self.records[path].output

    def status(self, path: str) -> str | None:
        record = self.records.get(path)
        return None if record is None else record.status

    def set(self, path: str, status: str, output: Any = None) -> None:
        self.records[path] = Record(status, output)

    def under(self, prefix: str) -> Iterator[str]:
        """Paths stored below `prefix` (`research[3].`)."""
        return (path for path in self.records if path.startswith(prefix))
