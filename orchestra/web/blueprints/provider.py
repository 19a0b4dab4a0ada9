"""`/api/v1/provider`: register, list, read, update, delete and check model providers.
Instance-wide ones: ADMINISTRATOR and above manage them, every user reads them; a
workspace's own (`workspace_id` in the body, `?workspace_id=` on the other routes; SPEC
§16): its admins manage them, its members read them."""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic_core import PydanticCustomError
from sanic import Blueprint, Request
from sanic.response import json

from orchestra.engine.llm.factory import SUPPORTED_KINDS
from orchestra.services import providers as provider_service
from orchestra.services.roles import Role
from orchestra.services.workspace_rights import Action
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented, query
from orchestra.web.apidoc.rules import (
    API_KEY_PATTERN,
    BASE_URL_PATTERN,
    ID_PATTERN,
    id_rule,
    model_rule,
    name_rule,
    rule,
)
from orchestra.web.apidoc.workspace_shapes import BLANK_WORKSPACE, NOT_A_MEMBER
from orchestra.web.auth import protected
from orchestra.web.paging import workspace_arg
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, ClosedBody, parse_body

bp = Blueprint("provider", url_prefix="/provider")


def _api_key():
    return rule(
        None,
        description="Printable ASCII, encrypted at rest, shown masked. null or \"\": no key.",
        pattern=API_KEY_PATTERN,
    )


def _base_url():
    return rule(
        None,
        description="An http:// or https:// URL with a host; null or \"\": the kind's default.",
        maxLength=provider_service.URL_MAX,
        pattern=BASE_URL_PATTERN,
    )


def _prices():
    return rule(None, description=(
        "USD per million tokens, overriding the price database: {input_per_mtok, "
        "output_per_mtok, cached_input_per_mtok?}, numbers or decimal strings, not negative; "
        "null: the database's price (SPEC §12)."))


def _limits():
    return rule(None, description=(
        "{requests_per_minute?, tokens_per_minute?, max_concurrency?}: positive whole numbers, "
        "held across every process; calls wait for room. null: no limits."))


class ProviderBody(Body):
    """A provider; `base_url` is required for `openai_compatible`."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "if": {"properties": {"provider": {"const": "openai_compatible"}}},
            "then": {
                "required": ["base_url"],
                "properties": {"base_url": {"type": "string", "pattern": r"\S"}},
            },
        }
    )

    name: str = name_rule()
    provider: str = rule(enum=list(SUPPORTED_KINDS), description="The provider kind.")
    model_id: str = model_rule()
    api_key: str | None = _api_key()
    base_url: str | None = _base_url()
    prices: dict[str, Any] | None = _prices()
    limits: dict[str, Any] | None = _limits()
    workspace_id: str | None = id_rule(None, description="The workspace it belongs to (you need admin there; "
                                       "404 when you are not a member); default: instance-wide (ADMINISTRATOR+).")

    @pydantic.field_validator("provider")
    @classmethod
    def _supported(cls, value: str) -> str:
        """Reported together with any other field error, so a 422 always names the kinds."""
        if value not in SUPPORTED_KINDS:
            raise PydanticCustomError(
                "provider_kind",
                "unsupported provider kind {kind}; supported kinds: {kinds}",
                {"kind": repr(value[:40]), "kinds": ", ".join(SUPPORTED_KINDS)},
            )
        return value


class ProviderUpdateBody(ClosedBody):
    """Only the named fields change; `provider` (the kind) is fixed. Null is refused
    for name and model_id (not sent: unchanged), and removes api_key / base_url."""

    name: str = name_rule(None)
    model_id: str = model_rule(None)
    api_key: str | None = _api_key()
    base_url: str | None = _base_url()
    prices: dict[str, Any] | None = _prices()
    limits: dict[str, Any] | None = _limits()


_WORKSPACE = query("workspace_id", "The workspace's providers (you need admin there to change them, any role "
                   "to read them; 404 when you are not a member); default: the instance-wide ones "
                   "(ADMINISTRATOR+ to change them).", type="string", pattern=ID_PATTERN)
_ERRORS = {403: "PermissionDeniedError: instance-wide providers need ADMINISTRATOR+ to change, a workspace's "
                "need admin there.", 404: NOT_A_MEMBER}
_READ_ERRORS = {404: NOT_A_MEMBER, 422: BLANK_WORKSPACE}  # ?workspace_id=
_QUERY_ERRORS = {**_ERRORS, 422: BLANK_WORKSPACE}  # routes without a body


async def _scope(request: Request, action: Action = Action.MANAGE) -> str | None:
    return await provider_service.scope_of(request.app.ctx.core, request.ctx.principal,
                                           workspace_arg(request), action)


@bp.post("", strict_slashes=False)
@documented(
    "Register a model provider", body=ProviderBody, response=out.Provider, status=201,
    errors={409: "ConflictError: the name is taken (ignoring case) in that workspace, or among the "
                 "instance-wide providers.", **_ERRORS},
    links={"Read": Link("provider.read", {"provider_id": "$response.body#/provider_id"}), "Check": Link("provider.check", {"provider_id": "$response.body#/provider_id"}), "Update": Link("provider.update", {"provider_id": "$response.body#/provider_id"}), "Delete": Link("provider.delete", {"provider_id": "$response.body#/provider_id"}), "CreateWorker": Link("agent.create_worker", request_body={"name": "worker", "provider_id": "$response.body#/provider_id"}), "SetNode": Link("agent.update_node", {"name": "planner"}, request_body={"provider": "$response.body#/provider_id"})},
)
@protected(Role.USER)
async def create(request: Request):
    core, principal = request.app.ctx.core, request.ctx.principal
    raw = request.json if isinstance(request.json, dict) else {}
    if raw.get("workspace_id") is None:  # instance-wide: the role first, as before workspaces
        await provider_service.scope_of(core, principal, None)
    body = parse_body(request, ProviderBody)
    workspace_id = await provider_service.scope_of(core, principal, body.workspace_id)
    provider = await provider_service.create_provider(
        core,
        name=body.name,
        kind=body.provider,
        model_id=body.model_id,
        api_key=body.api_key,
        base_url=body.base_url,
        prices=body.prices,
        limits=body.limits,
        created_by=principal.user_id,
        workspace_id=workspace_id,
    )
    return json({"message": SUCCESS, **provider_service.provider_view(provider)}, status=201)


@bp.get("", strict_slashes=False)
@documented("List the providers, oldest first: a workspace's, or the instance-wide ones",
            response=out.ProviderList, params=(_WORKSPACE,), errors=_READ_ERRORS)
@protected(Role.USER)
async def list_all(request: Request):
    rows = await provider_service.list_providers(request.app.ctx.core, await _scope(request, Action.READ))
    return json({"message": SUCCESS, "providers": [provider_service.provider_view(p) for p in rows]})


@bp.get("/<provider_id:str>")
@documented("Read a provider", response=out.Provider, params=(_WORKSPACE,), errors=_READ_ERRORS)
@protected(Role.USER)
async def read(request: Request, provider_id: str):
    workspace_id = await _scope(request, Action.READ)
    provider = await provider_service.get_provider(request.app.ctx.core, provider_id, workspace_id)
    return json({"message": SUCCESS, **provider_service.provider_view(provider)})


@bp.put("/<provider_id:str>")
@documented(
    "Change a provider (only the fields sent)", body=ProviderUpdateBody, response=out.Provider,
    params=(_WORKSPACE,),
    errors={409: "ConflictError: the name is taken (ignoring case) where the provider is.", **_ERRORS},
)
@protected(Role.USER)
async def update(request: Request, provider_id: str):
    workspace_id = await _scope(request)
    body = parse_body(request, ProviderUpdateBody)
    changes = {k: getattr(body, k) for k in body.model_fields_set}
    provider = await provider_service.update_provider(
        request.app.ctx.core, provider_id=provider_id, workspace_id=workspace_id, **changes
    )
    return json({"message": SUCCESS, **provider_service.provider_view(provider)})


@bp.delete("/<provider_id:str>")
@documented(
    "Delete a provider", response=out.Done, params=(_WORKSPACE,),
    errors={409: "ConflictError: workers or system nodes use it (detail names them).", **_QUERY_ERRORS},
)
@protected(Role.USER)
async def delete(request: Request, provider_id: str):
    workspace_id = await _scope(request)
    await provider_service.delete_provider(request.app.ctx.core, provider_id=provider_id,
                                           workspace_id=workspace_id)
    return json({"message": SUCCESS})


@bp.post("/<provider_id:str>/check")
@documented(
    "Ask the provider for its models (proves the key and URL work); a provider that cannot "
    "be reached or refuses is `ok: false` with `error`, a sentence of ours", response=out.ProviderCheck,
    params=(_WORKSPACE,), errors=_QUERY_ERRORS,
)
@protected(Role.USER)
async def check(request: Request, provider_id: str):
    workspace_id = await _scope(request)
    answer = await provider_service.check_provider(request.app.ctx.core, provider_id=provider_id,
                                                   workspace_id=workspace_id)
    return json({"message": SUCCESS, **answer})
