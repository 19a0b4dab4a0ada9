"""`current_time`: the current date and time, in UTC or an IANA time zone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from orchestra.engine.tools.base import Tool, ToolContext, ToolError


def now_iso(timezone: str | None = None) -> str:
    """ISO 8601 timestamp (seconds precision, with offset) in `timezone` (default UTC)."""
    tz: Any = UTC
    if timezone and timezone.strip().upper() not in ("UTC", "Z"):
        try:
            tz = ZoneInfo(timezone.strip())
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(
                f"Unknown time zone {timezone!r}; use an IANA name such as Europe/Paris."
            ) from None
    return datetime.now(tz).isoformat(timespec="seconds")


class CurrentTimeTool(Tool):
    name = "current_time"
    description = (
        "Get the current date and time as an ISO 8601 timestamp, in UTC or in the given "
        "IANA time zone (e.g. Europe/Paris, America/New_York)."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "timezone": {
                "type": "string",
                "description": "IANA time zone name; UTC when omitted.",
            }
        },
        "required": [],
        "additionalProperties": False,
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return now_iso(args.get("timezone"))
