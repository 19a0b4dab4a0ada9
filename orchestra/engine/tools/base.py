"""What a tool is, and the registry that validates and runs tools.

A tool is a name, a description and a JSON Schema for its arguments (what the model
sees), plus `async run(args, ctx) -> str`. Tools report failures the model should see
by raising `ToolError`; the engine turns that into an error `tool_result`. Anything
else a tool raises is a bug (or a cancellation) and propagates unchanged.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from orchestra.engine.llm.base import ToolSpec


class ToolError(Exception):
    """A tool could not do what was asked; `message` is shown to the model and the user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(slots=True)
class ToolContext:
    """What a tool may know and use about the run that called it.

    `read_upload(file_id)` returns the text of one of the user's uploads and
    `ask_user(question)` waits for the user's reply; the engine supplies both, and a
    tool needing one that is absent fails with `ToolError`.
    """

    user_id: str
    trace_id: str | None = None
    step_id: str | None = None
    read_upload: Callable[[str], Awaitable[str]] | None = None
    ask_user: Callable[[str], Awaitable[str]] | None = None
    mcp: Any = None  # the run's MCP sessions (engine/tools/mcp/sessions.RunSessions)


class Tool:
    """Base class for tools: set the three class attributes and implement `run`.
    `source` is what the catalog shows: "builtin", or `{"mcp": server_id}`."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    source: ClassVar[Any] = "builtin"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raise NotImplementedError

    def spec(self) -> ToolSpec:
        """The tool as offered to a model."""
        return ToolSpec(self.name, self.description, copy.deepcopy(self.parameters))


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def validate_args(schema: dict[str, Any], args: Any) -> None:
    """Minimal JSON Schema check: an object, required keys, property types and enums.

    Enough to give the model a clear message it can correct; not a full validator.
    """
    if not isinstance(args, dict):
        raise ToolError("Arguments must be a JSON object.")
    if "_raw" in args and len(args) == 1 and "_raw" not in schema.get("properties", {}):
        raise ToolError(f"Arguments were not valid JSON: {str(args['_raw'])[:200]}")
    properties: dict[str, Any] = schema.get("properties", {})
    missing = [key for key in schema.get("required", []) if key not in args]
    if missing:
        raise ToolError(f"Missing required argument(s): {', '.join(missing)}.")
    if schema.get("additionalProperties") is False:
        unknown = sorted(set(args) - set(properties))
        if unknown:
            raise ToolError(f"Unknown argument(s): {', '.join(unknown)}.")
    for key, value in args.items():
        prop = properties.get(key)
        if not prop:
            continue
        expected = prop.get("type")
        types = expected if isinstance(expected, list) else [expected] if expected else []
        if types and not any(_JSON_TYPES.get(t, lambda _v: True)(value) for t in types):
            raise ToolError(f"Argument {key!r} must be of type {' or '.join(types)}.")
        if "enum" in prop and value not in prop["enum"]:
            raise ToolError(f"Argument {key!r} must be one of {prop['enum']}.")


class ToolSource(Protocol):
    """Tools that come and go (MCP servers): read from the store by `load()`, then looked
    up without waiting, as a worker of `workspace_id` sees them (SPEC §16; None: only the
    instance-wide ones)."""

    async def load(self) -> None: ...

    def tools(self, workspace_id: str | None = None) -> list[Tool]: ...

    def get(self, name: str, workspace_id: str | None = None) -> Tool | None: ...


WIRE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what every provider accepts as a tool name


def wire_name(name: str) -> str:
    """A tool name as providers accept it (`[A-Za-z0-9_-]{1,64}`): itself when it fits,
    else `.` as `__`, other characters as `_`, cut to fit, with a short hash of the
    catalog name so that two names never meet."""
    if WIRE_NAME.match(name):
        return name
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", name.replace(".", "__"))
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return f"{clean[:57]}_{digest}"


class ToolRegistry:
    """Tools by name, in registration order, then those of its sources (MCP servers).
    Lookups take the workspace they are made for (`workspace_id`; None: the built-ins and
    the instance-wide sources' tools only): a workspace's own MCP servers' tools are found
    for it alone (SPEC §16)."""

    def __init__(self, tools: Iterable[Tool] = (), *, sources: Iterable[ToolSource] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._sources: list[ToolSource] = list(sources)
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def add_source(self, source: ToolSource) -> None:
        self._sources.append(source)

    async def load(self) -> None:
        """Bring the sources' tools up to date (a store read when their copy is stale)."""
        for source in self._sources:
            await source.load()

    def get(self, name: str, workspace_id: str | None = None) -> Tool | None:
        tool = self._tools.get(name)
        if tool is None:
            for source in self._sources:
                tool = source.get(name, workspace_id)
                if tool is not None:
                    break
        return tool

    def has(self, name: object, workspace_id: str | None = None) -> bool:
        return isinstance(name, str) and self.get(name, workspace_id) is not None

    def __contains__(self, name: object) -> bool:
        return self.has(name)

    def _all(self, workspace_id: str | None = None) -> list[Tool]:
        tools = list(self._tools.values())
        for source in self._sources:
            tools.extend(t for t in source.tools(workspace_id) if t.name not in self._tools)
        return tools

    def names(self, workspace_id: str | None = None) -> list[str]:
        return [t.name for t in self._all(workspace_id)]

    def catalog(self, workspace_id: str | None = None) -> list[dict[str, Any]]:
        """`[{name, description, parameters, source}]`, as `GET /api/v1/resource/tool`
        returns it for `workspace_id` (call `load()` first for the sources' current tools)."""
        return [
            {
                "name": t.name,
                "description": t.description,
                "parameters": copy.deepcopy(t.parameters),
                "source": copy.deepcopy(t.source),
            }
            for t in self._all(workspace_id)
        ]

    def specs(self, names: Iterable[str], workspace_id: str | None = None) -> list[ToolSpec]:
        """The `ToolSpec`s to offer a model; an unknown name raises `ToolError`."""
        return [self._require(name, workspace_id).spec() for name in names]

    def offer(self, names: Iterable[str], workspace_id: str | None = None
              ) -> tuple[list[ToolSpec], dict[str, str]]:
        """The specs to offer a model (of a run of `workspace_id`) under names it accepts
        (`wire_name`), and the way back: `{name the model uses: catalog name}`. Unknown
        names raise `ToolError`."""
        specs, back = [], {}
        for name in names:
            spec = self._require(name, workspace_id).spec()
            wire = wire_name(name)
            back[wire] = name
            specs.append(ToolSpec(wire, spec.description, spec.parameters))
        return specs, back

    async def run(self, name: str, args: dict[str, Any], ctx: ToolContext,
                  workspace_id: str | None = None) -> str:
        """Validate `args` against the tool's schema and run it."""
        tool = self._require(name, workspace_id)
        validate_args(tool.parameters, args)
        return await tool.run(args, ctx)

    def _require(self, name: str, workspace_id: str | None = None) -> Tool:
        tool = self.get(name, workspace_id)
        if tool is None:
            raise ToolError(f"Unknown tool {name!r}. Available: {', '.join(self.names(workspace_id))}.")
        return tool
