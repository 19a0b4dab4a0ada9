"""Tools an agent step may call, and the registry that validates and runs them.

A tool is a name, a description and a JSON Schema for its arguments (what the model
sees), plus `async run(args, ctx) -> str`. Tools report failures the model should see
by raising `ToolError`; the engine turns that into an error `tool_result`. Anything
else a tool raises is a bug (or a cancellation) and propagates unchanged. `base` holds
the types and the registry, `builtin` the built-in tools' registry.
"""

from orchestra.engine.tools.base import (
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSource,
    validate_args,
    wire_name,
)
from orchestra.engine.tools.builtin import default_registry

__all__ = [
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolSource",
    "default_registry",
    "validate_args",
    "wire_name",
]
