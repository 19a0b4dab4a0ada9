"""The built-in tools, and a registry holding them (each process's composition root
builds one and adds the MCP catalog as a source)."""

from __future__ import annotations

from orchestra.engine.tools.ask_user import AskUserTool
from orchestra.engine.tools.base import ToolRegistry
from orchestra.engine.tools.calculator import CalculatorTool
from orchestra.engine.tools.current_time import CurrentTimeTool
from orchestra.engine.tools.read_upload import ReadUploadTool


def default_registry() -> ToolRegistry:
    """A registry holding the built-in tools (MCP servers are added as a source)."""
    return ToolRegistry([CalculatorTool(), CurrentTimeTool(), ReadUploadTool(), AskUserTool()])
