"""Opening the store for one CLI command: settings from env + root options."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import typer

from orchestra.core import Core
from orchestra.settings import Settings


def settings_from(ctx: typer.Context, **overrides) -> Settings:
    """Settings from ORCHESTRA_* variables, then the root options, then `overrides`."""
    root = (ctx.find_root().obj or {}) if ctx else {}
    merged = {k: v for k, v in root.items() if v is not None}
    merged.update({k: v for k, v in overrides.items() if v is not None})  # unset flags hide nothing
    return Settings.from_env(**merged)


@asynccontextmanager
async def open_core(settings: Settings) -> AsyncIterator[Core]:
    core = await Core.open(settings)
    try:
        yield core
    finally:
        await core.close()
