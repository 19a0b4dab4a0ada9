"""`ask_user`: put a question to the user and wait for the answer.

The engine supplies `ctx.ask_user`, which publishes `reply_requested`, moves the run to
`waiting_reply` and resolves when `POST /reply/{trace_id}` arrives.
"""

from __future__ import annotations

from typing import Any, ClassVar

from orchestra.engine.tools.base import Tool, ToolContext, ToolError


class AskUserTool(Tool):
    name = "ask_user"
    description = (
        "Ask the user a question and wait for their answer. Use it when you need "
        "information or a decision only the user can give."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "The question to show the user."}
        },
        "required": ["question"],
        "additionalProperties": False,
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        question = args["question"].strip()
        if not question:
            raise ToolError("The question is empty.")
        if ctx.ask_user is None:
            raise ToolError("This run cannot ask the user questions.")
        return await ctx.ask_user(question)
