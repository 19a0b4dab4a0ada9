"""One blueprint per API area, grouped under /api/v1 by `all_blueprints()`."""

from __future__ import annotations

from sanic import Blueprint


def all_blueprints() -> Blueprint:
    """Every API area, as one group under /api/v1."""
    from orchestra.web.blueprints import auth

    areas = [auth.bp]
    for module_name in ("provider", "agent", "resource", "workflow", "adapter"):
        module = _optional(module_name)
        if module is not None:
            areas.append(module.bp)
    return Blueprint.group(*areas, url_prefix="/api/v1")


def _optional(name: str):
    """Areas land one by one; a missing module is simply not served yet."""
    import importlib

    try:
        return importlib.import_module(f"orchestra.web.blueprints.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"orchestra.web.blueprints.{name}":
            raise
        return None
