"""Event times as the API writes them (`ts`: ISO 8601 UTC with a `Z`), read back as epoch
seconds: by the CLI's live view and by the engine (how long a question has waited)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def parse_ts(value: Any) -> float | None:
    """An event's `ts` (epoch seconds, or an ISO 8601 string) as epoch seconds; None when
    absent or unreadable."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
