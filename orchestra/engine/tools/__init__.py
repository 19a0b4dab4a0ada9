"""Tools an agent step may call (`base.py`: what a tool is, and the registry), and the
built-in ones.

A tool is a name, a description and a JSON Schema for its arguments (what the model
sees), plus `async run(args, ctx) -> str`. Tools report failures the model should see
by raising `ToolError`; the engine turns that into an error `tool_result`. Anything
else a tool raises is a bug (or a cancellation) and propagates unchanged.
"""

from __future__ import annotations

from orchestra.engine.tools.ask_user import AskUserTool
from orchestra.engine.tools.base import (
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSource,
    validate_args,
    wire_name,
)
from orchestra.engine.tools.calculator import CalculatorTool
from orchestra.engine.tools.current_time import CurrentTimeTool
from orchestra.engine.tools.read_upload import ReadUploadTool


def default_registry() -> ToolRegistry:
    """A registry holding the built-in tools (MCP servers are added as a source)."""
    return ToolRegistry([CalculatorTool(), CurrentTimeTool(), ReadUploadTool(), AskUserTool()])


REGISTRY = default_registry()

__all__ = [
    "REGISTRY",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolSource",
    "default_registry",
    "validate_args",
    "wire_name",
]
