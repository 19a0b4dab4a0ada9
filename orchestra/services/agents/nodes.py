"""System nodes (SPEC §3): the built-in nodes of `node_specs`; only their provider and
model are stored and editable. A change drops the agent cache's copy (`Caches`). A node
is instance-wide: its provider is an instance-wide one (a workspace's provider reads as
unknown, SPEC §16).
"""

from __future__ import annotations

from typing import Any

from peewee import IntegrityError

from orchestra.db.models import Provider, SystemNode, iso, storable, utcnow
from orchestra.errors import NotFoundError, ValidationError
from orchestra.services import audit
from orchestra.services.node_specs import NODE_SPECS, NodeSpec
from orchestra.services.providers import clean_model, providers_by_id, usable_by
from orchestra.services.shared import Shared

_UNSET: Any = object()


def _node_view(spec: NodeSpec, row: SystemNode | None, provider: Provider | None) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "provider": row.provider_id if row else None,
        "provider_name": provider.name if provider else None,
        "model": row.model if row else None,
        "tools": list(spec.tools),
        "updated_at": iso(row.updated_at) if row else None,
    }


async def list_nodes(core: Shared) -> list[dict[str, Any]]:
    """The built-in nodes, in a fixed order, with their configured provider and model."""
    rows = {n.name: n for n in await core.db.list(SystemNode.select())}
    providers = await providers_by_id(core, {n.provider_id for n in rows.values() if n.provider_id})
    return [
        _node_view(spec, rows.get(spec.name), providers.get(getattr(rows.get(spec.name), "provider_id", None)))
        for spec in NODE_SPECS.values()
    ]


def _node_spec(name: str) -> NodeSpec:
    spec = NODE_SPECS.get(name)
    if spec is None:
        raise NotFoundError(f"No system node is named '{name}'; there are {', '.join(NODE_SPECS)}.")
    return spec


async def get_node(core: Shared, name: str) -> dict[str, Any]:
    spec = _node_spec(name)
    row = await SystemNode.aget_or_none(SystemNode.name == spec.name)
    provider = await Provider.aget_or_none(Provider.id == row.provider_id) if row and row.provider_id else None
    return _node_view(spec, row, provider)


async def update_node(core: Shared, *, name: str, provider: str | None = _UNSET, model: str | None = _UNSET) -> dict[str, Any]:
    """Set a node's provider (an id; null clears) and/or model (null: the provider's model_id)."""
    spec = _node_spec(name)
    if provider is _UNSET and model is _UNSET:
        raise ValidationError.field("body", "send provider and/or model")
    if provider is not _UNSET and provider is not None and (
        not storable(provider) or await Provider.aget_or_none((Provider.id == provider) & usable_by(None)) is None
    ):
        raise ValidationError.field("provider", f"unknown provider '{provider}' (a system node uses an "
                                    "instance-wide provider)")
    if model is not _UNSET and model is not None:
        model = clean_model(model, "model")
    values: dict[Any, Any] = {SystemNode.updated_at: utcnow()}
    if provider is not _UNSET:
        values[SystemNode.provider] = provider
    if model is not _UNSET:
        values[SystemNode.model] = model
    upsert = SystemNode.insert({SystemNode.name: spec.name, **values}).on_conflict(
        conflict_target=[SystemNode.name], update=values
    )
    try:
        async with core.write_transaction():
            rows = await core.db.list(SystemNode.select().where(SystemNode.name == spec.name))
            row = rows[0] if rows else None
            before = {"provider": row.provider_id if row else None, "model": row.model if row else None}
            await core.db.aexecute(upsert)
            after = {"provider": before["provider"] if provider is _UNSET else provider,
                     "model": before["model"] if model is _UNSET else model}
            await audit.record(core, action="node.update", target=audit.target("node", spec.name, spec.name),
                               changes=audit.diff(before, after))
    except IntegrityError:  # the provider was deleted meanwhile
        raise ValidationError.field("provider", f"unknown provider '{provider}'") from None
    core.caches.changed("system_node")
    return await get_node(core, spec.name)
