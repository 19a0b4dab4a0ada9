"""`read_upload`: the text of one of the calling user's uploaded files.

The lookup (ownership, size limits, decoding) belongs to the uploads service, which the
engine passes in as `ctx.read_upload`; this tool only forwards the request.
"""

from __future__ import annotations

from typing import Any, ClassVar

from orchestra.engine.tools.base import Tool, ToolContext, ToolError


class ReadUploadTool(Tool):
    name = "read_upload"
    description = "Read the text content of one of the user's uploaded files, by its file_id."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "file_id": {"type": "string", "description": "The file_id given at upload time."}
        },
        "required": ["file_id"],
        "additionalProperties": False,
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        file_id = args["file_id"].strip()
        if not file_id:
            raise ToolError("file_id is empty.")
        if ctx.read_upload is None:
            raise ToolError("Uploaded files are not available in this run.")
        return await ctx.read_upload(file_id)
