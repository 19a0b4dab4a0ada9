"""`/api/v1/provider`: register, list, read, update, delete and check model providers."""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic_core import PydanticCustomError
from sanic import Blueprint, Request
from sanic.response import json

from orchestra.engine.llm.factory import SUPPORTED_KINDS
from orchestra.services import providers as provider_service
from orchestra.services.roles import Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.apidoc.rules import (
    API_KEY_PATTERN,
    BASE_URL_PATTERN,
    model_rule,
    name_rule,
    rule,
)
from orchestra.web.auth import protected
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


@bp.post("", strict_slashes=False)
@documented(
    "Register a model provider", body=ProviderBody, response=out.Provider, status=201,
    errors={409: "ConflictError: the name is taken (ignoring case)."},
    links={"Read": Link("provider.read", {"provider_id": "$response.body#/provider_id"}), "Check": Link("provider.check", {"provider_id": "$response.body#/provider_id"}), "Update": Link("provider.update", {"provider_id": "$response.body#/provider_id"}), "Delete": Link("provider.delete", {"provider_id": "$response.body#/provider_id"}), "CreateWorker": Link("agent.create_worker", request_body={"name": "worker", "provider_id": "$response.body#/provider_id"}), "SetNode": Link("agent.update_node", {"name": "planner"}, request_body={"provider": "$response.body#/provider_id"})},
)
@protected(Role.ADMINISTRATOR)
async def create(request: Request):
    body = parse_body(request, ProviderBody)
    provider = await provider_service.create_provider(
        request.app.ctx.core,
        name=body.name,
        kind=body.provider,
        model_id=body.model_id,
        api_key=body.api_key,
        base_url=body.base_url,
        prices=body.prices,
        limits=body.limits,
        created_by=request.ctx.principal.user_id,
    )
    return json({"message": SUCCESS, **provider_service.provider_view(provider)}, status=201)


@bp.get("", strict_slashes=False)
@documented("List the providers, oldest first", response=out.ProviderList)
@protected(Role.USER)
async def list_all(request: Request):
    rows = await provider_service.list_providers(request.app.ctx.core)
    return json({"message": SUCCESS, "providers": [provider_service.provider_view(p) for p in rows]})


@bp.get("/<provider_id:str>")
@documented("Read a provider", response=out.Provider)
@protected(Role.USER)
async def read(request: Request, provider_id: str):
    provider = await provider_service.get_provider(request.app.ctx.core, provider_id)
    return json({"message": SUCCESS, **provider_service.provider_view(provider)})


@bp.put("/<provider_id:str>")
@documented(
    "Change a provider (only the fields sent)", body=ProviderUpdateBody, response=out.Provider,
    errors={409: "ConflictError: the name is taken (ignoring case)."},
)
@protected(Role.ADMINISTRATOR)
async def update(request: Request, provider_id: str):
    body = parse_body(request, ProviderUpdateBody)
    changes = {k: getattr(body, k) for k in body.model_fields_set}
    provider = await provider_service.update_provider(
        request.app.ctx.core, provider_id=provider_id, **changes
    )
    return json({"message": SUCCESS, **provider_service.provider_view(provider)})


@bp.delete("/<provider_id:str>")
@documented(
    "Delete a provider", response=out.Done,
    errors={409: "ConflictError: workers or system nodes use it (detail names them)."},
)
@protected(Role.ADMINISTRATOR)
async def delete(request: Request, provider_id: str):
    await provider_service.delete_provider(request.app.ctx.core, provider_id=provider_id)
    return json({"message": SUCCESS})


@bp.post("/<provider_id:str>/check")
@documented(
    "Ask the provider for its models (proves the key and URL work); a provider that cannot "
    "be reached or refuses is `ok: false` with `error`, a sentence of ours", response=out.ProviderCheck,
)
@protected(Role.ADMINISTRATOR)
async def check(request: Request, provider_id: str):
    answer = await provider_service.check_provider(request.app.ctx.core, provider_id=provider_id)
    return json({"message": SUCCESS, **answer})
