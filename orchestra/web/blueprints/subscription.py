"""`/api/v1/workflow/subscription`: other systems told of your runs' events, signed per
Standard Webhooks, from an outbox (SPEC §11). A subscription is its owner's, or its team
workspace's members' by role (SPEC §16): others get 404."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.services import subscriptions as service
from orchestra.services.audit_events import FILTERS_MAX
from orchestra.services.roles import Role
from orchestra.web.apidoc import trigger_shapes as out
from orchestra.web.apidoc.models import Done
from orchestra.web.apidoc.operation import Link, documented, query
from orchestra.web.apidoc.rules import URL_PATTERN, id_rule, rule
from orchestra.web.apidoc.workspace_shapes import NOT_A_MEMBER, WORKSPACE_FILTER
from orchestra.web.auth import protected
from orchestra.web.paging import (
    PAGE_ERRORS,
    count_arg,
    page_args,
    page_body,
    page_params,
    workspace_arg,
)
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("subscription", url_prefix="/workflow/subscription")

_ID = {"subscription_id": "$response.body#/subscription_id"}


class SubscriptionBody(Body):
    url: str = rule(description="Where deliveries are POSTed: http(s)://host[:port][/path]. A host the "
                    "egress rule refuses is 422 (ORCHESTRA_STEP_EGRESS_ALLOW).",
                    maxLength=service.URL_MAX, pattern=URL_PATTERN)
    events: list[str] = rule(description="The events to deliver: one to four run events, and up to "
                             f"{FILTERS_MAX} audit events (SPEC §16: `audit.*`, `audit.<type>.*`, "
                             "`audit.<type>.<verb>`; the entries of the subscription's workspace, for "
                             "its admins only). template_id limits the run events only.",
                             minItems=1, maxItems=4 + FILTERS_MAX, items=out.EVENT_SCHEMA)
    template_id: str | None = id_rule(None, description="Only runs of this template (one you may run, "
                                      "of the subscription's workspace or shared).")
    workspace_id: str | None = id_rule(None, description="The workspace it belongs to (you need editor "
                                       "there; 404 when you are not a member); default: your personal one, "
                                       "told of your runs. A team workspace's is told of that workspace's runs.")


_BELOW = "PermissionDeniedError: your role in the subscription's workspace is below editor."
_BELOW_NEW = ("PermissionDeniedError: your role in the workspace is below editor, or below admin for "
              "audit events (`detail.role_needed`).")


@bp.post("", strict_slashes=False)
@documented(
    "Subscribe a URL to your runs' events, or your workspace's audit entries (the secret is shown "
    "this once)",
    body=SubscriptionBody, response=out.SubscriptionCreated, status=201,
    errors={403: _BELOW_NEW, 404: NOT_A_MEMBER,
            422: "ValidationError: a URL the egress rule refuses (`url`, with the setting), a "
                 "template you may not run or of another workspace (`template_id`)."},
    links={
        "Read": Link("subscription.read", _ID),
        "Deliveries": Link("subscription.deliveries", _ID),
        "Delete": Link("subscription.delete", _ID),
    },
)
@protected(Role.USER)
async def create(request: Request):
    body = parse_body(request, SubscriptionBody)
    row, secret = await service.create_subscription(
        request.app.ctx.core, user_id=request.ctx.principal.user_id, url=body.url,
        events=list(body.events), template_id=body.template_id, workspace_id=body.workspace_id)
    return json({"message": SUCCESS, "subscription_id": row.id, "secret": secret,
                 "subscription": service.subscription_view(row)}, status=201)


@bp.get("", strict_slashes=False)
@documented("List your subscriptions and your workspaces', oldest first", response=out.SubscriptionList,
            params=(*page_params("subscriptions"), WORKSPACE_FILTER), errors={404: NOT_A_MEMBER, 422: PAGE_ERRORS})
@protected(Role.USER)
async def list_all(request: Request):
    limit, cursor = page_args(request)
    page = await service.list_subscriptions(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                            limit=limit, cursor=cursor,
                                            workspace_id=workspace_arg(request))
    return json(page_body("subscriptions", [service.subscription_view(r) for r in page.rows], page))


@bp.get("/<subscription_id:str>")
@documented("Read a subscription (never its secret)", response=out.Subscription)
@protected(Role.USER)
async def read(request: Request, subscription_id: str):
    row = await service.get_subscription(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                         subscription_id=subscription_id)
    return json({"message": SUCCESS, "subscription_id": row.id, "subscription": service.subscription_view(row)})


@bp.delete("/<subscription_id:str>")
@documented("Delete a subscription and its deliveries (pending ones are not sent)", response=Done,
            errors={403: _BELOW})
@protected(Role.USER)
async def delete(request: Request, subscription_id: str):
    await service.delete_subscription(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                      subscription_id=subscription_id)
    return json({"message": SUCCESS})


@bp.get("/<subscription_id:str>/deliveries")
@documented(
    "A subscription's deliveries, newest first, with every attempt's response code",
    response=out.DeliveryList,
    params=(query("limit", f"At most this many (default and maximum {service.DELIVERIES_MAX}).",
                  type="integer", minimum=1, maximum=service.DELIVERIES_MAX),),
    errors={422: "ValidationError: limit out of range."},
)
@protected(Role.USER)
async def deliveries(request: Request, subscription_id: str):
    limit = count_arg(request, "limit", default=service.DELIVERIES_MAX, low=1, high=service.DELIVERIES_MAX)
    rows = await service.list_deliveries(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                         subscription_id=subscription_id, limit=limit)
    return json({"message": SUCCESS, "deliveries": [service.delivery_view(r) for r in rows]})


@bp.post("/<subscription_id:str>/deliveries/<delivery_id:str>/retry")
@documented("Attempt a delivery again now (the same webhook-id and body)", response=out.Delivery,
            errors={403: _BELOW})
@protected(Role.USER)
async def retry(request: Request, subscription_id: str, delivery_id: str):
    row = await service.retry_delivery(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                       subscription_id=subscription_id, delivery_id=delivery_id)
    return json({"message": SUCCESS, "delivery": service.delivery_view(row)})
