"""Every workspace role's rights and refusals over every route (SPEC §16), in process on
both stores: one table, one row per route (and per variant whose least role differs,
such as granting `owner`), each naming the least role that may call it. For every row
and every caller — the team workspace's owner, admin, editor, runner and viewer, a user
who is no member and an instance ADMINISTRATOR who is no member — the call is answered
2xx (the caller's role is at least the row's), 403 `PermissionDeniedError` whose
`detail.role_needed` is the row's least role (a member below it), or 404 `NotFoundError`
(not a member: the workspace's existence is not told).

The table must cover the app: every route the router serves is a row or in `EXCLUDED`,
each exclusion with its reason, so a new route without a row fails
`test_every_route_has_a_row_or_a_reason`. A row that deletes, cancels, answers or tops
up acts, for each call that is to succeed, on a resource made for that call (its
factory's), and a refused call on the fixture's, which the refusal leaves as it was; so
the calls' order does not matter. The rest share one fixture."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from orchestra.services import auth
from tests.conftest import LOOPBACK_STEPS

API = "/api/v1"
WS = f"{API}/workspace"
WF = f"{API}/workflow"
ROLES = ("owner", "admin", "editor", "runner", "viewer")  # highest first
RANK = {role: len(ROLES) - i for i, role in enumerate(ROLES)}
OUTSIDERS = ("outsider", "instance_admin")  # members of nothing here
CALLERS = ROLES + OUTSIDERS
HUMAN = [{"id": "h", "agent": {"human": True}, "prompt": "Name for {{input}}?"}]
CLOSED = "http://127.0.0.1:9"  # nothing listens: probes and deliveries fail at once
PRICES = {"input_per_mtok": "1000", "output_per_mtok": "2000"}
NAMES = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}{next(NAMES)}"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return dict(LOOPBACK_STEPS)  # subscriptions deliver to a loopback URL


# --- the world: a team workspace with one of everything ---------------------------------


class World:
    """The team workspace `ws` of `owner`, its members, one of each resource in it, and
    factories of fresh ones for the calls that use one up."""

    def __init__(self, client, people: dict[str, dict]) -> None:
        self.client = client
        self.people = people
        self.ids: dict[str, str] = {}

    def headers(self, who: str) -> dict[str, str]:
        return self.people[who]["headers"]

    async def ok(self, method: str, url: str, who: str = "owner", status: int | None = None, **kw) -> dict:
        response = await self.client.request(method, url, headers=self.headers(who), **kw)
        assert 200 <= response.status_code < 300 and (status is None or response.status_code == status), \
            f"{method} {url}: {response.status_code} {response.text}"
        return response.json() if response.content else {}

    # fresh resources of the workspace, made by its owner

    async def template(self, steps=HUMAN, **extra) -> str:
        made = await self.ok("POST", f"{WF}/template", json={
            "name": fresh("t"), "steps": steps, "workspace_id": self.ids["ws"], **extra})
        return made["template_id"]

    async def run(self, template: str = "template", status: str | None = "waiting_reply") -> str:
        started = await self.ok("POST", f"{WF}/run", status=202,
                                json={"template_id": self.ids[template], "input": "x"})
        trace_id = started["trace_id"]
        if status is not None:
            await self.wait(trace_id, status)
        return trace_id

    async def wait(self, trace_id: str, status: str) -> None:
        for _ in range(1000):
            body = await self.ok("GET", f"{WF}/run/{trace_id}")
            if body["status"] == status:
                return
            assert body["status"] in ("queued", "running"), body
            await asyncio.sleep(0.01)
        raise AssertionError(f"{trace_id} stayed {body['status']}, not {status}")

    async def user(self) -> dict:
        made = await auth.register(self.client.app.ctx.core, user_name=fresh("user-"), password="password-123")
        return {"user_id": made.id, "user_name": made.user_name}

    async def member(self, role: str) -> str:
        """A new user, added to the workspace with `role`; their user_id."""
        user = await self.user()
        await self.ok("POST", f"{WS}/{self.ids['ws']}/member", status=201,
                      json={"user_name": user["user_name"], "role": role})
        return user["user_id"]

    async def workspace(self) -> str:
        """A new team workspace of `owner` with the same members, holding nothing."""
        made = await self.ok("POST", WS, status=201, json={"name": fresh("ws")})
        for role in ROLES[1:]:
            await self.ok("POST", f"{WS}/{made['workspace_id']}/member", status=201,
                          json={"user_name": self.people[role]["user_name"], "role": role})
        return made["workspace_id"]

    async def own_key(self, who: str) -> str:
        """A key of `who` in the workspace. Making one needs `admin` there, so a member
        below it is made admin for the moment and given their role back (revoking one's
        own key needs no role: what the row shows)."""
        ws = self.ids["ws"]
        if who in OUTSIDERS:
            return self.ids["key"]  # the owner's: not theirs
        role = who
        if RANK[who] < RANK["admin"]:
            await self.ok("PUT", f"{WS}/{ws}/member/{self.people[who]['user_id']}", json={"role": "admin"})
        made = await self.ok("POST", f"{API}/auth/key", who=who, status=201,
                             json={"name": fresh("k"), "scopes": ["run:read"], "workspace_id": ws})
        if RANK[who] < RANK["admin"]:
            await self.ok("PUT", f"{WS}/{ws}/member/{self.people[who]['user_id']}", json={"role": role})
        return made["key_id"]


@pytest.fixture
async def world(client, users) -> World:
    people = {name: await users.make(name) for name in ROLES + ("outsider",)}
    people["instance_admin"] = await users.make("instance_admin", "ADMINISTRATOR")
    w = World(client, people)
    made = await w.ok("POST", WS, status=201, json={"name": "team"})
    ws = w.ids["ws"] = made["workspace_id"]
    for role in ROLES[1:]:
        await w.ok("POST", f"{WS}/{ws}/member", status=201,
                   json={"user_name": people[role]["user_name"], "role": role})
    ids = w.ids
    # what the refused member changes name (a refusal leaves them as they are)
    people["spare"] = await w.user()
    for role in ("owner", "editor", "viewer"):
        ids[f"{role}_member"] = await w.member(role)
    # a template with a human step, in two versions (so a diff has two ends)
    ids["template"] = await w.template()
    await w.ok("PUT", f"{WF}/template/{ids['template']}", json={"name": "main", "steps": HUMAN})
    # admin's things: a provider (priced, so a tiny budget pauses a run before any call),
    # a secret, an MCP server (unreachable: saved with its last_error), a key
    ids["provider"] = (await w.ok("POST", f"{API}/provider", status=201, json={
        "name": "p", "provider": "openai_compatible", "model_id": "m", "base_url": f"{CLOSED}/v1",
        "prices": PRICES, "workspace_id": ws}))["provider_id"]
    ids["secret"] = "TOKEN"
    await w.ok("POST", f"{API}/resource/secret", status=201, json={
        "name": "TOKEN", "value": "team-token-0123456789", "hosts": ["api.example.com"], "workspace_id": ws})
    ids["mcp"] = (await w.ok("POST", f"{API}/resource/mcp", status=201, json={
        "name": "crm", "transport": "streamable_http", "url": f"{CLOSED}/mcp", "workspace_id": ws}))["server_id"]
    ids["key"] = (await w.ok("POST", f"{API}/auth/key", status=201, json={
        "name": "nightly", "scopes": ["run:read"], "workspace_id": ws}))["key_id"]
    # editor's things: a worker, a schedule, a hook, a subscription that hears the run below
    ids["worker"] = (await w.ok("POST", f"{API}/agent/worker", status=201, json={
        "name": "w", "provider_id": ids["provider"], "workspace_id": ws}))["worker_id"]
    ids["budget_template"] = await w.template(
        steps=[{"id": "a", "agent": {"worker": ids["worker"]}, "prompt": "Say {{input}}"}],
        limits={"budget_usd": "0.000001", "on_budget": "pause"})
    ids["schedule"] = (await w.ok("POST", f"{WF}/schedule", status=201, json={
        "template_id": ids["template"], "cron": "0 0 1 1 *", "workspace_id": ws}))["schedule_id"]
    ids["hook"] = (await w.ok("POST", f"{WF}/hook", status=201, json={
        "template_id": ids["template"], "workspace_id": ws}))["hook_id"]
    ids["subscription"] = (await w.ok("POST", f"{WF}/subscription", status=201, json={
        "url": f"{CLOSED}/hook", "events": ["run.waiting_reply"], "template_id": ids["template"],
        "workspace_id": ws}))["subscription_id"]
    # runs: one waiting for a reply, one for budget, one ended (cancelled)
    ids["run"] = await w.run()
    ids["paused"] = await w.run("budget_template", "waiting_budget")
    ids["ended"] = await w.run()
    await w.ok("POST", f"{WF}/cancel/{ids['ended']}")
    await w.wait(ids["ended"], "cancelled")
    deliveries = (await w.ok("GET", f"{WF}/subscription/{ids['subscription']}/deliveries"))["deliveries"]
    assert deliveries, "the waiting runs made no delivery"
    ids["delivery"] = deliveries[0]["delivery_id"]
    return w


# --- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    url: str
    params: dict[str, str] | None = None
    json: Any = None


Factory = Callable[[World, str, bool], Awaitable[Call]]


@dataclass(frozen=True)
class Row:
    method: str
    route: str  # the router's path, as the OpenAPI document writes it
    least: str  # the least role that may call it
    make: Factory  # (world, caller, fresh) → the call; `fresh`: it is to succeed, so it may
    # use up what it acts on (a refused call leaves the fixture's as it was)
    variant: str = ""  # what tells apart two rows of one route

    @property
    def name(self) -> str:
        return f"{self.method} {self.route}" + (f" ({self.variant})" if self.variant else "")


def at(path: str, *, query: bool = False, body: Callable[[World], Any] | None = None) -> Factory:
    """A call on the shared fixture: `path`'s {names} are the world's ids (`{ws}`...);
    `query`: ?workspace_id= the workspace; `body(world)`: the JSON body."""

    async def make(w: World, who: str, fresh: bool) -> Call:
        return Call(path.format(**w.ids), {"workspace_id": w.ids["ws"]} if query else None,
                    body(w) if body else None)

    return make


def on_fresh(path: str, resource: Callable[[World], Awaitable[str]], spare: str, *, query: bool = False,
             body: Callable[[World], Any] | None = None) -> Factory:
    """A call on a resource made for it when it is to succeed: `path`'s `{id}` is what
    `resource(world)` made; for a call to be refused, the fixture's `spare` of that kind
    (which a refusal leaves as it was)."""

    async def make(w: World, who: str, fresh: bool) -> Call:
        made = await resource(w) if fresh else w.ids[spare]
        return Call(path.format(id=made, **w.ids), {"workspace_id": w.ids["ws"]} if query else None,
                    body(w) if body else None)

    return make


def in_ws(**body: Any) -> Callable[[World], dict]:
    """A creation body naming the workspace; a value that is a callable is called (fresh names)."""
    return lambda w: {**{k: v() if callable(v) else v for k, v in body.items()}, "workspace_id": w.ids["ws"]}


async def own_key(w: World, who: str, fresh: bool) -> Call:
    return Call(f"{API}/auth/key/{await w.own_key(who)}")


async def new_provider(w: World) -> str:
    return (await w.ok("POST", f"{API}/provider", status=201, json={
        "name": fresh("p"), "provider": "openai_compatible", "model_id": "m", "base_url": f"{CLOSED}/v1",
        "workspace_id": w.ids["ws"]}))["provider_id"]


async def new_mcp(w: World) -> str:
    return (await w.ok("POST", f"{API}/resource/mcp", status=201, json={
        "name": fresh("m"), "transport": "streamable_http", "url": f"{CLOSED}/mcp",
        "workspace_id": w.ids["ws"]}))["server_id"]


async def new_secret(w: World) -> str:
    name = fresh("S")
    await w.ok("POST", f"{API}/resource/secret", status=201, json={
        "name": name, "value": "value-0123456789", "hosts": ["api.example.com"], "workspace_id": w.ids["ws"]})
    return name


async def new_worker(w: World) -> str:
    return (await w.ok("POST", f"{API}/agent/worker", status=201, json={
        "name": fresh("w"), "provider_id": w.ids["provider"], "workspace_id": w.ids["ws"]}))["worker_id"]


async def new_schedule(w: World) -> str:
    return (await w.ok("POST", f"{WF}/schedule", status=201, json={
        "template_id": w.ids["template"], "cron": "0 0 1 1 *", "workspace_id": w.ids["ws"]}))["schedule_id"]


async def new_hook(w: World) -> str:
    return (await w.ok("POST", f"{WF}/hook", status=201, json={
        "template_id": w.ids["template"], "workspace_id": w.ids["ws"]}))["hook_id"]


async def new_subscription(w: World) -> str:
    return (await w.ok("POST", f"{WF}/subscription", status=201, json={
        "url": f"{CLOSED}/hook", "events": ["run.failed"], "workspace_id": w.ids["ws"]}))["subscription_id"]


async def new_template(w: World) -> str:
    return await w.template()


async def waiting_run(w: World) -> str:
    return await w.run()


async def queued_run(w: World) -> str:
    return await w.run(status=None)


async def paused_run(w: World) -> str:
    """A run its own tiny budget paused before its first call (`waiting_budget`)."""
    return await w.run("budget_template", "waiting_budget")


def member(role: str) -> Callable[[World], Awaitable[str]]:
    return lambda w: w.member(role)


def new_user(role: str) -> Callable[[World], dict]:
    async def make(w: World, who: str, fresh: bool) -> Call:
        user = await w.user() if fresh else w.people["spare"]
        return Call(f"{WS}/{w.ids['ws']}/member", json={"user_name": user["user_name"], "role": role})

    return make


def _workspace(w: World) -> Awaitable[str]:
    return w.workspace()


TEMPLATE_BODY = {"name": "main", "steps": HUMAN}
def run_body(w: World) -> dict:
    return {"template_id": w.ids["template"], "input": "x"}
SUB = f"{WF}/subscription"

TABLE: list[Row] = [
    # the workspace and its members
    Row("GET", "/api/v1/workspace/{workspace_id}", "viewer", at(WS + "/{ws}")),
    Row("PUT", "/api/v1/workspace/{workspace_id}", "admin", at(WS + "/{ws}", body=lambda w: {"name": "team"})),
    Row("DELETE", "/api/v1/workspace/{workspace_id}", "owner", on_fresh(WS + "/{id}", _workspace, "ws")),
    Row("GET", "/api/v1/workspace/{workspace_id}/member", "viewer", at(WS + "/{ws}/member")),
    Row("POST", "/api/v1/workspace/{workspace_id}/member", "admin", new_user("viewer"), "below owner"),
    Row("POST", "/api/v1/workspace/{workspace_id}/member", "owner", new_user("owner"), "an owner"),
    Row("PUT", "/api/v1/workspace/{workspace_id}/member/{user_id}", "admin",
        on_fresh(WS + "/{ws}/member/{id}", member("viewer"), "viewer_member",
                 body=lambda w: {"role": "runner"}), "below owner"),
    Row("PUT", "/api/v1/workspace/{workspace_id}/member/{user_id}", "owner",
        on_fresh(WS + "/{ws}/member/{id}", member("viewer"), "viewer_member",
                 body=lambda w: {"role": "owner"}), "grant owner"),
    Row("PUT", "/api/v1/workspace/{workspace_id}/member/{user_id}", "owner",
        on_fresh(WS + "/{ws}/member/{id}", member("owner"), "owner_member",
                 body=lambda w: {"role": "viewer"}), "take owner"),
    Row("DELETE", "/api/v1/workspace/{workspace_id}/member/{user_id}", "admin",
        on_fresh(WS + "/{ws}/member/{id}", member("editor"), "editor_member"), "below owner"),
    Row("DELETE", "/api/v1/workspace/{workspace_id}/member/{user_id}", "owner",
        on_fresh(WS + "/{ws}/member/{id}", member("owner"), "owner_member"), "an owner"),
    # admin: secrets, providers, MCP servers, keys, the audit log
    Row("POST", "/api/v1/resource/secret", "admin", at(f"{API}/resource/secret", body=in_ws(
        name=lambda: fresh("S"), value="value-0123456789", hosts=["api.example.com"]))),
    Row("GET", "/api/v1/resource/secret", "admin", at(f"{API}/resource/secret", query=True)),
    Row("PUT", "/api/v1/resource/secret/{name}", "admin",
        at(f"{API}/resource/secret/TOKEN", query=True, body=lambda w: {"hosts": ["api.example.com"]})),
    Row("DELETE", "/api/v1/resource/secret/{name}", "admin",
        on_fresh(API + "/resource/secret/{id}", new_secret, "secret", query=True)),
    Row("POST", "/api/v1/provider", "admin", at(f"{API}/provider", body=in_ws(
        name=lambda: fresh("p"), provider="openai_compatible", model_id="m", base_url=f"{CLOSED}/v1"))),
    Row("GET", "/api/v1/provider", "viewer", at(f"{API}/provider", query=True)),
    Row("GET", "/api/v1/provider/{provider_id}", "viewer", at(API + "/provider/{provider}", query=True)),
    Row("PUT", "/api/v1/provider/{provider_id}", "admin",
        at(API + "/provider/{provider}", query=True, body=lambda w: {"model_id": "m"})),
    Row("DELETE", "/api/v1/provider/{provider_id}", "admin", on_fresh(API + "/provider/{id}", new_provider, "provider", query=True)),
    Row("POST", "/api/v1/provider/{provider_id}/check", "admin", at(API + "/provider/{provider}/check", query=True)),
    Row("POST", "/api/v1/resource/mcp", "admin", at(f"{API}/resource/mcp", body=in_ws(
        name=lambda: fresh("m"), transport="streamable_http", url=f"{CLOSED}/mcp"))),
    Row("GET", "/api/v1/resource/mcp", "viewer", at(f"{API}/resource/mcp", query=True)),
    Row("GET", "/api/v1/resource/mcp/{server_id}", "viewer", at(API + "/resource/mcp/{mcp}", query=True)),
    Row("PUT", "/api/v1/resource/mcp/{server_id}", "admin", at(API + "/resource/mcp/{mcp}", query=True, body=lambda w: {
        "name": "crm", "transport": "streamable_http", "url": f"{CLOSED}/mcp"})),
    Row("DELETE", "/api/v1/resource/mcp/{server_id}", "admin", on_fresh(API + "/resource/mcp/{id}", new_mcp, "mcp", query=True)),
    Row("POST", "/api/v1/resource/mcp/{server_id}/refresh", "admin",
        at(API + "/resource/mcp/{mcp}/refresh", query=True)),
    Row("GET", "/api/v1/resource/tool", "viewer", at(f"{API}/resource/tool", query=True)),
    Row("POST", "/api/v1/auth/key", "admin", at(f"{API}/auth/key", body=in_ws(
        name=lambda: fresh("k"), scopes=["run:read"]))),
    Row("GET", "/api/v1/auth/key", "viewer", at(f"{API}/auth/key", query=True)),
    # one's own key, whatever the role (a non-member: the owner's, not told)
    Row("DELETE", "/api/v1/auth/key/{key_id}", "viewer", own_key, "one's own"),
    Row("GET", "/api/v1/audit", "admin", at(f"{API}/audit", query=True)),
    Row("GET", "/api/v1/usage", "viewer", at(f"{API}/usage", query=True)),
    Row("POST", "/api/v1/workflow/subscription", "admin", at(SUB, body=in_ws(
        url=f"{CLOSED}/hook", events=["audit.workspace.delete"])), "audit events"),
    # editor: templates, workers, schedules, hooks, subscriptions
    Row("POST", "/api/v1/workflow/template", "editor",
        at(f"{WF}/template", body=in_ws(name=lambda: fresh("t"), steps=HUMAN))),
    Row("GET", "/api/v1/workflow/template", "viewer", at(f"{WF}/template", query=True)),
    Row("POST", "/api/v1/workflow/template/check", "viewer", at(f"{WF}/template/check", body=in_ws(
        name="draft", steps=HUMAN))),
    Row("GET", "/api/v1/workflow/template/{template_id}", "viewer", at(WF + "/template/{template}")),
    Row("PUT", "/api/v1/workflow/template/{template_id}", "editor",
        at(WF + "/template/{template}", body=lambda w: TEMPLATE_BODY)),
    Row("DELETE", "/api/v1/workflow/template/{template_id}", "editor", on_fresh(WF + "/template/{id}", new_template, "template")),
    Row("GET", "/api/v1/workflow/template/{template_id}/diff", "viewer", at(WF + "/template/{template}/diff")),
    Row("GET", "/api/v1/workflow/template/{template_id}/versions", "viewer", at(WF + "/template/{template}/versions")),
    Row("GET", "/api/v1/workflow/template/{template_id}/versions/{number}", "viewer",
        at(WF + "/template/{template}/versions/1")),
    Row("POST", "/api/v1/workflow/template/{template_id}/versions/{number}/restore", "editor",
        at(WF + "/template/{template}/versions/1/restore")),
    Row("POST", "/api/v1/agent/worker", "editor", at(f"{API}/agent/worker", body=lambda w: {
        "name": fresh("w"), "provider_id": w.ids["provider"], "workspace_id": w.ids["ws"]})),
    Row("GET", "/api/v1/agent/worker", "viewer", at(f"{API}/agent/worker", query=True)),
    Row("GET", "/api/v1/agent/worker/{worker_id}", "viewer", at(API + "/agent/worker/{worker}")),
    Row("PUT", "/api/v1/agent/worker/{worker_id}", "editor",
        at(API + "/agent/worker/{worker}", body=lambda w: {"description": "d"})),
    Row("DELETE", "/api/v1/agent/worker/{worker_id}", "editor", on_fresh(API + "/agent/worker/{id}", new_worker, "worker")),
    Row("POST", "/api/v1/workflow/schedule", "editor", at(f"{WF}/schedule", body=lambda w: {
        "template_id": w.ids["template"], "cron": "0 0 1 1 *", "workspace_id": w.ids["ws"]})),
    Row("GET", "/api/v1/workflow/schedule", "viewer", at(f"{WF}/schedule", query=True)),
    Row("GET", "/api/v1/workflow/schedule/{schedule_id}", "viewer", at(WF + "/schedule/{schedule}")),
    Row("PUT", "/api/v1/workflow/schedule/{schedule_id}", "editor", at(WF + "/schedule/{schedule}", body=lambda w: {
        "template_id": w.ids["template"], "cron": "0 0 1 1 *"})),
    Row("DELETE", "/api/v1/workflow/schedule/{schedule_id}", "editor", on_fresh(WF + "/schedule/{id}", new_schedule, "schedule")),
    Row("GET", "/api/v1/workflow/schedule/{schedule_id}/fires", "viewer", at(WF + "/schedule/{schedule}/fires")),
    Row("POST", "/api/v1/workflow/hook", "editor", at(f"{WF}/hook", body=lambda w: {
        "template_id": w.ids["template"], "workspace_id": w.ids["ws"]})),
    Row("GET", "/api/v1/workflow/hook", "viewer", at(f"{WF}/hook", query=True)),
    Row("GET", "/api/v1/workflow/hook/{hook_id}", "viewer", at(WF + "/hook/{hook}")),
    Row("DELETE", "/api/v1/workflow/hook/{hook_id}", "editor", on_fresh(WF + "/hook/{id}", new_hook, "hook")),
    Row("POST", "/api/v1/workflow/subscription", "editor", at(SUB, body=in_ws(
        url=f"{CLOSED}/hook", events=["run.failed"])), "run events"),
    Row("GET", "/api/v1/workflow/subscription", "viewer", at(SUB, query=True)),
    Row("GET", "/api/v1/workflow/subscription/{subscription_id}", "viewer", at(SUB + "/{subscription}")),
    Row("DELETE", "/api/v1/workflow/subscription/{subscription_id}", "editor",
        on_fresh(SUB + "/{id}", new_subscription, "subscription")),
    Row("GET", "/api/v1/workflow/subscription/{subscription_id}/deliveries", "viewer",
        at(SUB + "/{subscription}/deliveries")),
    Row("POST", "/api/v1/workflow/subscription/{subscription_id}/deliveries/{delivery_id}/retry", "editor",
        at(SUB + "/{subscription}/deliveries/{delivery}/retry")),
    # runner: runs
    Row("POST", "/api/v1/workflow/run", "runner", at(f"{WF}/run", body=run_body)),
    Row("GET", "/api/v1/workflow/run", "viewer", at(f"{WF}/run", query=True)),
    Row("GET", "/api/v1/workflow/run/{trace_id}", "viewer", at(WF + "/run/{run}")),
    Row("GET", "/api/v1/workflow/run/{trace_id}/events", "viewer", at(WF + "/run/{run}/events")),
    Row("GET", "/api/v1/workflow/sse/{trace_id}", "viewer", at(WF + "/sse/{ended}")),  # ended: the stream ends
    Row("POST", "/api/v1/workflow/cancel/{trace_id}", "runner", on_fresh(WF + "/cancel/{id}", queued_run, "run")),
    Row("POST", "/api/v1/workflow/reply/{trace_id}", "runner",
        on_fresh(WF + "/reply/{id}", waiting_run, "run", body=lambda w: {"content": "Ada"})),
    Row("POST", "/api/v1/workflow/run/{trace_id}/retry", "runner", at(WF + "/run/{ended}/retry")),
    Row("POST", "/api/v1/workflow/run/{trace_id}/fork", "runner", at(WF + "/run/{run}/fork", body=lambda w: {})),
    Row("POST", "/api/v1/workflow/run/{trace_id}/budget", "runner",
        on_fresh(WF + "/run/{id}/budget", paused_run, "paused", body=lambda w: {"add_usd": "0.000001"})),
]

#: Routes with no row, and why: none of them acts on a team workspace's resource by the
#: caller's role there. A new route must get a row above or a line here.
EXCLUDED: dict[str, str] = {
    # workspaces themselves: any user creates one (becoming its owner) and lists their own
    "POST /api/v1/workspace": "any user creates a workspace; no workspace role applies yet",
    "GET /api/v1/workspace": "lists the caller's own workspaces (?all=true: SUPER_ADMINISTRATOR)",
    # a user's own things and the instance's: the seed's instance roles, not workspace roles
    "POST /api/v1/adapter/client/upload": "uploads are their user's own, in no workspace",
    "GET /api/v1/adapter/client/upload": "uploads are their user's own, in no workspace",
    "GET /api/v1/adapter/client/upload/{file_id}": "uploads are their user's own, in no workspace",
    "DELETE /api/v1/adapter/client/upload/{file_id}": "uploads are their user's own, in no workspace",
    "GET /api/v1/agent/node": "system nodes are instance-wide (SPEC §7)",
    "GET /api/v1/agent/node/{name}": "system nodes are instance-wide (SPEC §7)",
    "PUT /api/v1/agent/node/{name}": "system nodes are instance-wide, ADMINISTRATOR+ (SPEC §7)",
    "POST /api/v1/agent/reload": "reloads the instance's agents, ADMINISTRATOR+",
    "GET /api/v1/resource/skill": "skills are instance-wide (SPEC §16: no workspace_id)",
    "POST /api/v1/resource/skill": "skills are instance-wide (SPEC §16: no workspace_id)",
    "GET /api/v1/resource/skill/{skill_id}": "skills are instance-wide",
    "PUT /api/v1/resource/skill/{skill_id}": "skills are instance-wide",
    "DELETE /api/v1/resource/skill/{skill_id}": "skills are instance-wide",
    "POST /api/v1/auth/register": "accounts: the seed's auth routes",
    "POST /api/v1/auth/login": "accounts: the seed's auth routes",
    "POST /api/v1/auth/refresh": "accounts: the seed's auth routes",
    "GET /api/v1/auth/list": "accounts: instance roles (ADMINISTRATOR+)",
    "PUT /api/v1/auth/authority": "accounts: instance roles (SUPER_ADMINISTRATOR)",
    "DELETE /api/v1/auth/{user_id}": "accounts: instance roles",
    # called by another system, authenticated by the hook's signature, not by a member
    "POST /api/v1/hooks/{hook_id}": "a hook's intake is signed with the hook's secret, no user's role",
    # not of the REST API
    "GET /": "the console's page",
    "GET /console/{relative}": "the console's assets",
    "GET /api/v1/docs": "the API documentation",
    "GET /api/v1/docs/assets/{asset}": "the API documentation",
    "GET /api/v1/docs/openapi.json": "the API documentation",
    "GET /api/v1/docs/redoc": "the API documentation",
    "GET /api/v1/docs/swagger": "the API documentation",
    "GET /mcp": "the MCP endpoint: templates as tools, by role (tests/web/test_mcp_rights.py)",
    "POST /mcp": "the MCP endpoint: templates as tools, by role (tests/web/test_mcp_rights.py)",
    "DELETE /mcp": "the MCP endpoint: its session's end",
}


def router_routes(app) -> set[str]:
    """`METHOD /path` of every route the app serves, its parameters written as OpenAPI
    writes them (`<trace_id:str>` → `{trace_id}`)."""
    found = set()
    for route in app.router.routes:
        path = "/" + re.sub(r"<([^:>]+)(:[^>]*)?>", r"{\1}", route.path).rstrip("/") if route.path else "/"
        for method in route.methods:
            if method not in ("HEAD", "OPTIONS"):
                found.add(f"{method} {path}")
    return found


async def test_every_route_has_a_row_or_a_reason(client):
    served = router_routes(client.app)
    documented = {f"{method.upper()} {path}"
                  for path, ops in (await client.get(f"{API}/docs/openapi.json")).json()["paths"].items()
                  for method in ops if method in ("get", "post", "put", "delete", "patch")}
    assert documented <= served  # the document describes routes that exist
    rows = {f"{row.method} {row.route}" for row in TABLE}
    assert not rows & set(EXCLUDED), "a route is both a row and excluded"
    assert sorted(served - rows - set(EXCLUDED)) == [], "routes without a row in TABLE or a reason in EXCLUDED"
    assert sorted((rows | set(EXCLUDED)) - served) == [], "rows or exclusions of routes that do not exist"
    names = [row.name for row in TABLE]
    assert len(names) == len(set(names)), "two rows of one route need variants"
    # every documented route that takes a workspace's resource — ?workspace_id=, a body's
    # workspace_id, or the id of a thing in a workspace — has a row
    doc = (await client.get(f"{API}/docs/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    in_workspace = re.compile(r"\{(workspace_id|template_id|trace_id|worker_id|schedule_id|hook_id|"
                              r"subscription_id|provider_id|server_id|key_id|name|delivery_id|number)\}")
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            key = f"{method.upper()} {path}"
            ref = (op.get("requestBody", {}).get("content", {}).get("application/json", {})
                   .get("schema", {}).get("$ref", ""))
            body = schemas.get(ref.rsplit("/", 1)[-1], {}).get("properties", {}) if ref else {}
            takes = ("workspace_id" in body or any(p["name"] == "workspace_id" for p in op.get("parameters", []))
                     or (in_workspace.search(path) and not key.startswith(
                         ("POST /api/v1/hooks/", "GET /api/v1/agent/node/", "PUT /api/v1/agent/node/"))))
            if takes:
                assert key in rows, f"{key} takes a workspace's resource but has no row"


async def outcome(w: World, row: Row, who: str) -> str | None:
    """None when the call is answered as the table says, else what was wrong."""
    succeeds = who not in OUTSIDERS and RANK[who] >= RANK[row.least]
    call = await row.make(w, who, succeeds)
    response = await w.client.request(row.method, call.url, params=call.params, json=call.json,
                                      headers=w.headers(who))
    status, text = response.status_code, response.text[:300]
    if who in OUTSIDERS:
        if status != 404 or response.json().get("error") != "NotFoundError":
            return f"{who}: expected 404 NotFoundError, got {status} {text}"
    elif succeeds:
        if not 200 <= status < 300:
            return f"{who}: expected 2xx, got {status} {text}"
    else:
        body = response.json() if status == 403 else {}
        if status != 403 or body.get("error") != "PermissionDeniedError" \
                or body.get("detail") != {"role_needed": row.least, "role": who}:
            return f"{who}: expected 403 naming {row.least!r} (and {who!r}), got {status} {text}"
    return None


async def test_every_role_over_every_route(world):
    wrong = []
    for row in TABLE:
        for who in CALLERS:
            problem = await outcome(world, row, who)
            if problem:
                wrong.append(f"{row.name}: {problem}")
    assert wrong == [], "\n".join(wrong)
