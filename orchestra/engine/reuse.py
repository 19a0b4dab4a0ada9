"""Reuse of finished work (SPEC §7, §13): the events of the instances a new run starts
with, and a fork's run-time reuse of its source's calls.

**Events.** A retry's copied steps say `step_finished {reused: true}` (SPEC §7); a fork's
copied instances say `step_reused {source_trace_id, output}` (SPEC §13), one per
instance, items and iterations included, with `overridden: true` for a step whose output
the fork's `outputs` set.

**Reuse keys.** Every agent or human call stores, with its output, the digest of what it
ran with (`run_step.reuse_key`, `call_key`): its definition (for an item of a one-call
foreach, the step without the map's own settings `foreach`, `depends_on` and `when`),
its rendered prompt, the run's attached files, and for an agent the configuration the
worker or system node had when the call was made (`AGENT_FIELDS`: provider, its kind and
base URL, model, system prompt, skill instructions, tools). Two calls with one key are
the same call. The key carries no secret: a rotated API key, or changed prices and
limits, change no answer.

**Run-time reuse** (`ForkReuse`, the engine's one reuse hook). A fork stores up front the
instances its plan could decide before running (services/fork_plan.py). Every other call
it reaches is decided when it is about to be made, with everything it reads evaluated:
if a succeeded call of the source run (same step id, any instance: an item that moved in
the mapped list counts) has the same key, its output is copied — no provider call, the
row `reused` with the key, `step_reused {source_trace_id, output}` (and `source_path`
when the source's instance had another path). Steps the fork must run again whatever
they read — `from_step` and everything downstream of it (`forked_from.again`) — never
are. HTTP and workflow steps are not keyed: they run again unless the plan copied them.
A code step (SPEC §17) is keyed by its definition and what its source may read
(`code_key`): never copied by the plan, it is copied here when its key is the source's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from orchestra.engine import instances
from orchestra.engine.live import LiveRun
from orchestra.engine.model import At, StepDef
from orchestra.engine.records import Records
from orchestra.language.code import step_reads
from orchestra.vocabulary import EventKind, StepStatus

KEY_VERSION = 1  # a new way of keying makes earlier keys never match (they are re-run)
# What of a worker's or node's configuration an answer depends on (not its key, name, prices).
AGENT_FIELDS = ("kind", "id", "provider_id", "provider_kind", "provider_base_url", "model",
                "system_prompt", "skill_instructions", "tools")
_MAP_SETTINGS = {"foreach": None, "depends_on": (), "when": None}  # an item's call ignores these
_DIGESTS_MAX = 4096


def reused_events(live: LiveRun) -> list[tuple[str, dict[str, Any], At | str]]:
    """(kind, data, step) of every instance stored as reused before the run started."""
    if not live.forked_from:
        return [(EventKind.STEP_FINISHED, {"output": state["output"], "reused": True}, sid)
                for sid, state in live.states.items()]
    source = live.forked_from.get("trace_id")
    overridden = set(live.forked_from.get("outputs") or [])
    events = []
    for path, record in live.finished.records.items():
        step_id = instances.parse(path)[-1].step_id
        data: dict[str, Any] = {"output": record.output, "source_trace_id": source}
        if path in overridden:
            data["overridden"] = True
        events.append((EventKind.STEP_REUSED, data, At(step_id, path)))
    return events


# -- keys ---------------------------------------------------------------------------------
def keyed(step: StepDef) -> bool:
    """An agent or human call (or a one-call foreach's item): the calls that carry a key."""
    return step.agent is not None and step.http is None and step.workflow is None


def _definition_fields(step: StepDef) -> dict[str, Any]:
    fields = dataclasses.asdict(step)
    if step.foreach is not None:  # an item's call: the map's own settings decide no answer
        fields.update(_MAP_SETTINGS)
    return fields


def _agent_fields(config: Any) -> dict[str, Any]:
    return {name: getattr(config, name, None) for name in AGENT_FIELDS}


class _Digests:
    """Each object's digest, computed once per object (a run holds its StepDefs for its
    life, the agent cache its AgentConfigs until a change); emptied past a bound."""

    def __init__(self, fields: Any) -> None:
        self._fields = fields
        self._digests: dict[int, tuple[Any, str]] = {}

    def digest(self, value: Any) -> str:
        found = self._digests.get(id(value))
        if found is not None and found[0] is value:
            return found[1]
        digest = hashlib.sha256(_canonical(self._fields(value))).hexdigest()
        if len(self._digests) >= _DIGESTS_MAX:
            self._digests.clear()
        self._digests[id(value)] = (value, digest)
        return digest


_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _canonical(value: Any) -> bytes:
    return _ENCODER.encode(value).encode("utf-8", "surrogatepass")


_definitions = _Digests(_definition_fields)
_agents = _Digests(_agent_fields)


def agent_fingerprint(config: Any) -> str:
    """The digest of what of a worker's or node's configuration (an AgentConfig) an
    answer depends on (`AGENT_FIELDS`)."""
    return _agents.digest(config)


def call_key(step: StepDef, prompt: str, files: list[dict[str, Any]] | None, agent: str | None) -> str:
    """The reuse key of a call of `step` with this rendered prompt, these attached files
    and this agent fingerprint (`agent_fingerprint`): each part length-prefixed, so no
    two different calls hash the same bytes."""
    digest = hashlib.sha256(b"orchestra-call-%d" % KEY_VERSION)
    for part in (_definitions.digest(step).encode(), prompt.encode("utf-8", "surrogatepass"),
                 _canonical([f.get("file_id") for f in files]) if files else b"",
                 (agent or "").encode()):
        digest.update(b"%d:" % len(part))
        digest.update(part)
    return digest.hexdigest()


def code_key(step: StepDef, variables: dict[str, Any]) -> str:
    """The reuse key of a code step's instance (SPEC §17): its definition and everything
    its source may read — `input`, `item`, `index`, `loop`, and of `steps` the ids it
    names (`steps['id']`; all ended steps when it reads `steps` otherwise)."""
    named = step_reads(step.code["source"]) if step.code else None
    read = dict(variables)
    if named is not None and isinstance(read.get("steps"), dict):
        read["steps"] = {sid: state for sid, state in read["steps"].items() if sid in named}
    return call_key(step, _canonical(read).decode("utf-8", "surrogatepass"), None, "code")


# -- a fork's run-time reuse --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SourceCall:
    """A succeeded call of the source run: where, and its output as stored."""

    path: str
    output: Any
    structured: bool


class SourceCalls:
    """The source run's succeeded, keyed calls by key (read once per fork run)."""

    def __init__(self, trace_id: str, rows: list[Any]) -> None:
        self.trace_id = trace_id
        self.by_key: dict[str, list[SourceCall]] = {}
        for row in rows:
            if row.reuse_key and row.status == StepStatus.SUCCEEDED:
                structured = row.output_value is not None
                self.by_key.setdefault(row.reuse_key, []).append(SourceCall(
                    row.path or row.step_id, row.output_value if structured else row.output, structured))

    def find(self, key: str, path: str) -> SourceCall | None:
        """The source's call with this key: the one at the same path if there is one."""
        found = self.by_key.get(key)
        if not found:
            return None
        return next((call for call in found if call.path == path), found[0])


class ForkReuse:
    """The engine's reuse hook: a fork's call that its source already made is copied."""

    def __init__(self, store: Any, records: Records) -> None:
        self.store = store
        self.records = records

    @staticmethod
    def applies(live: LiveRun, step: StepDef) -> bool:
        """A fork's call that may be reused (not `from_step` nor downstream of it)."""
        fork = live.forked_from
        return bool(fork) and bool(fork.get("trace_id")) and step.id not in (fork.get("again") or ())

    async def take(self, live: LiveRun, step: StepDef, at: At, key: str, *, durable: bool) -> SourceCall | None:
        """The source's call with `key`, copied into the run at `at` (its row and
        `step_reused` stored, and waited for when `durable`); None when there is none."""
        source = await self._source(live)
        found = source.find(key, at.path)
        if found is None:
            return None
        data: dict[str, Any] = {"output": found.output, "source_trace_id": source.trace_id}
        if found.path != at.path:
            data["source_path"] = found.path
        write = self.records.reused(live, at, found.output, key, found.structured, data)
        if durable:
            await self.records.stored(live, write)
        return found

    async def _source(self, live: LiveRun) -> SourceCalls:
        """The source's calls, read once per run (concurrent items wait for one read)."""
        if live.fork_source is None:
            live.fork_source = asyncio.ensure_future(self._read(live.forked_from["trace_id"]))
        try:
            return await asyncio.shield(live.fork_source)
        except Exception:
            live.fork_source = None  # read again next time (the store may be back)
            raise

    async def _read(self, trace_id: str) -> SourceCalls:
        rows = await self.store.step_rows(trace_id)
        await self.store.release()
        return SourceCalls(trace_id, rows)
