"""One blueprint per API area, grouped under /api/v1 by `all_blueprints()`."""

from __future__ import annotations

from sanic import Blueprint


def all_blueprints() -> Blueprint:
    """Every API area, as one group under /api/v1."""
    from orchestra.web.blueprints import (
        adapter,
        agent,
        audit,
        auth,
        hook_intake,
        hooks,
        keys,
        mcp,
        provider,
        resource,
        schedule,
        secret,
        subscription,
        usage,
        versions,
        workflow,
        workspace,
    )

    areas = [auth, keys, provider, agent, resource, mcp, secret, schedule, subscription, workflow, versions,
             hooks, hook_intake, usage, audit, workspace, adapter]
    return Blueprint.group(*(area.bp for area in areas), url_prefix="/api/v1")
