"""`/api/v1/provider`: register, list, read, update, delete and check model providers."""

from __future__ import annotations

import pydantic
from pydantic_core import PydanticCustomError
from sanic import Blueprint, Request
from sanic.response import json
from sanic_ext import openapi

from orchestra.engine.llm.factory import SUPPORTED_KINDS
from orchestra.services import providers as provider_service
from orchestra.services.roles import Role
from orchestra.web.auth import protected
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, ClosedBody, parse_body

bp = Blueprint("provider", url_prefix="/provider")



class ProviderBody(Body):
    name: str
    provider: str
    model_id: str
    api_key: str | None = None
    base_url: str | None = None

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

    name: str = None  # type: ignore[assignment]
    model_id: str = None  # type: ignore[assignment]
    api_key: str | None = None
    base_url: str | None = None


@bp.post("", strict_slashes=False)
@openapi.body({"application/json": ProviderBody}, required=True)
@openapi.response(201, description="The provider, its API key masked.")
@openapi.secured("bearer")
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
        created_by=request.ctx.principal.user_id,
    )
    return json({"message": SUCCESS, **provider_service.provider_view(provider)}, status=201)


@bp.get("", strict_slashes=False)
@openapi.secured("bearer")
@protected(Role.USER)
async def list_all(request: Request):
    rows = await provider_service.list_providers(request.app.ctx.core)
    return json({"message": SUCCESS, "providers": [provider_service.provider_view(p) for p in rows]})


@bp.get("/<provider_id:str>")
@openapi.secured("bearer")
@protected(Role.USER)
async def read(request: Request, provider_id: str):
    provider = await provider_service.get_provider(request.app.ctx.core, provider_id)
    return json({"message": SUCCESS, **provider_service.provider_view(provider)})


@bp.put("/<provider_id:str>")
@openapi.body({"application/json": ProviderUpdateBody}, required=True)
@openapi.secured("bearer")
@protected(Role.ADMINISTRATOR)
async def update(request: Request, provider_id: str):
    body = parse_body(request, ProviderUpdateBody)
    changes = {k: getattr(body, k) for k in body.model_fields_set}
    provider = await provider_service.update_provider(
        request.app.ctx.core, provider_id=provider_id, **changes
    )
    return json({"message": SUCCESS, **provider_service.provider_view(provider)})


@bp.delete("/<provider_id:str>")
@openapi.secured("bearer")
@protected(Role.ADMINISTRATOR)
async def delete(request: Request, provider_id: str):
    await provider_service.delete_provider(request.app.ctx.core, provider_id=provider_id)
    return json({"message": SUCCESS})


@bp.post("/<provider_id:str>/check")
@openapi.response(200, description="message, ok: true, models; 502 ProviderError on failure.")
@openapi.secured("bearer")
@protected(Role.ADMINISTRATOR)
async def check(request: Request, provider_id: str):
    models = await provider_service.check_provider(request.app.ctx.core, provider_id=provider_id)
    return json({"message": SUCCESS, "ok": True, "models": models})
