"""Caps per user on what every user shares (SPEC §15b): one user's schedules and
subscriptions are bounded by a setting each, and one more is a 422 naming it.

A cap is checked when a row is made, inside the write transaction that stores it (on
SQLite that transaction is serialised; on PostgreSQL two creates racing at the very cap
may both pass, leaving the user one over: the cap bounds a flood, not an exact count)."""

from __future__ import annotations

from orchestra.errors import ValidationError
from orchestra.services.shared import Shared


async def check(core: Shared, query, *, setting: str, what: str, field: str) -> None:
    """422 naming `ORCHESTRA_<SETTING>` when `query` (the user's rows) already counts the cap."""
    limit = int(getattr(core.settings, setting))
    if await core.db.count(query) >= limit:
        name = f"ORCHESTRA_{setting.upper()}"
        problem = f"you have {limit} {what}, the most one user may have ({name}); delete one first"
        raise ValidationError(f"{field}: {problem}", detail=[{"field": field, "problem": problem,
                                                              "setting": name}])
