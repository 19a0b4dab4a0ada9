"""A workspace's own secrets (SPEC §16, issue 34), through the API on both stores, against
a real loopback HTTP server: a workspace's admins store, list, change and delete its
secrets (an editor gets 403 naming `admin`, a non-member 404), instance-wide ones stay
ADMINISTRATOR+'s; a run of the workspace sends its own secret over an instance-wide one
of the same name; a template of another workspace never finds it (422 at save where the
URL writes its host, a failed step before any byte leaves where it does not); the
workspace's deletion deletes its secrets; entries go to the workspace's audit chain."""

from __future__ import annotations

import itertools
import json

import pytest

from orchestra.db.audit_models import AuditEntry
from orchestra.db.models import RunEvent, RunStep, Secret
from orchestra.testing.fake_http import FakeHttp
from tests.conftest import LOOPBACK_STEPS
from tests.web.teams import two_teams
from tests.web.test_workflow_routes import API, assert_error, wait_for

SECRETS = "/api/v1/resource/secret"
WS = "/api/v1/workspace"
TEAM_VALUE = "team-a-token-0123456789"
INSTANCE_VALUE = "instance-token-9876543210"
NAMES = itertools.count()


@pytest.fixture(scope="module")
def target():
    with FakeHttp() as server:
        yield server


@pytest.fixture
def settings_overrides():
    return dict(LOOPBACK_STEPS)


@pytest.fixture
def database_url(both_stores):
    return both_stores



@pytest.fixture
async def team(client, users):
    return await two_teams(client, users)


async def store(client, who, name, value, hosts, workspace_id=None):
    body = {"name": name, "value": value, "hosts": hosts}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post(SECRETS, json=body, headers=who["headers"])


def sending(url: str, name: str = "API_KEY") -> list[dict]:
    return [{"id": "call", "http": {"method": "GET", "url": url, "headers": {"X-K": "{{ secrets." + name + " }}"}}}]


async def template_in(client, who, steps, workspace_id=None):
    body = {"name": f"t{next(NAMES)}", "steps": steps}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post(f"{API}/template", headers=who["headers"], json=body)


async def run_of(client, who, template_id, input="x") -> dict:
    started = await client.post(f"{API}/run", headers=who["headers"], json={"template_id": template_id, "input": input})
    assert started.status_code == 202, started.text
    return await wait_for(client, who, started.json()["trace_id"], "succeeded", "failed", timeout=20)


async def stored_text(client, trace_id: str) -> str:
    db = client.app.ctx.core.db
    events = [[e.kind, e.data] for e in await db.list(RunEvent.select().where(RunEvent.run == trace_id))]
    rows = [[r.output, r.error] for r in await db.list(RunStep.select().where(RunStep.run == trace_id))]
    return json.dumps(events + rows)


async def test_a_workspace_admin_manages_its_secrets_others_cannot(client, team):
    a = team["a"]
    made = await store(client, team["bob"], "API_KEY", TEAM_VALUE, ["127.0.0.1"], a)
    assert made.status_code == 201, made.text
    assert made.json()["workspace_id"] == a and made.json()["name"] == "API_KEY"
    assert TEAM_VALUE not in made.text
    body = assert_error(await store(client, team["carol"], "OTHER", TEAM_VALUE, ["x.example"], a),
                        403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "admin" and "'admin'" in body["message"]
    for who in ("eve", "admin"):  # not a member: the workspace is not told, to an ADMINISTRATOR neither
        assert_error(await store(client, team[who], "OTHER", TEAM_VALUE, ["x.example"], a), 404, "NotFoundError")
    # a name is unique within the workspace; an instance-wide secret may have it too
    assert_error(await store(client, team["alice"], "API_KEY", TEAM_VALUE, ["x.example"], a), 409, "ConflictError")
    instance = await store(client, team["admin"], "API_KEY", INSTANCE_VALUE, ["127.0.0.1"])
    assert instance.status_code == 201 and instance.json()["workspace_id"] is None, instance.text
    # instance-wide secrets stay ADMINISTRATOR+'s, a workspace admin's too
    assert_error(await store(client, team["bob"], "MINE", TEAM_VALUE, ["x.example"]), 403, "PermissionDeniedError")
    # every user is owner of their personal workspace
    [personal] = (await client.get(WS, headers=team["eve"]["headers"])).json()["workspaces"]
    own = await store(client, team["eve"], "API_KEY", TEAM_VALUE, ["x.example"], personal["workspace_id"])
    assert own.status_code == 201 and own.json()["workspace_id"] == personal["workspace_id"], own.text

    # lists: a workspace's, or the instance-wide ones; never a value
    listed = await client.get(SECRETS, params={"workspace_id": a}, headers=team["bob"]["headers"])
    assert listed.status_code == 200, listed.text
    assert [(s["name"], s["workspace_id"]) for s in listed.json()["secrets"]] == [("API_KEY", a)]
    wide = await client.get(SECRETS, headers=team["admin"]["headers"])
    assert [(s["name"], s["workspace_id"]) for s in wide.json()["secrets"]] == [("API_KEY", None)]
    for text in (listed.text, wide.text):
        assert TEAM_VALUE not in text and INSTANCE_VALUE not in text
    assert_error(await client.get(SECRETS, params={"workspace_id": a}, headers=team["carol"]["headers"]),
                 403, "PermissionDeniedError")
    assert_error(await client.get(SECRETS, params={"workspace_id": a}, headers=team["eve"]["headers"]),
                 404, "NotFoundError")

    # change and delete, by the same rule; the instance-wide one of that name is not touched
    url = f"{SECRETS}/API_KEY"
    assert_error(await client.put(url, params={"workspace_id": a}, json={"hosts": ["y.example"]},
                                  headers=team["carol"]["headers"]), 403, "PermissionDeniedError")
    assert_error(await client.delete(url, params={"workspace_id": a}, headers=team["eve"]["headers"]),
                 404, "NotFoundError")
    changed = await client.put(url, params={"workspace_id": a}, json={"value": "team-a-token-new-4242"},
                               headers=team["bob"]["headers"])
    assert changed.status_code == 200 and changed.json()["hint"] == "…4242", changed.text
    stored = await Secret.aget((Secret.name == "API_KEY") & Secret.workspace_id.is_null())
    assert client.app.ctx.core.secrets.decrypt(stored.value_encrypted) == INSTANCE_VALUE
    gone = await client.delete(url, params={"workspace_id": a}, headers=team["bob"]["headers"])
    assert gone.status_code == 200, gone.text
    assert await Secret.aget_or_none((Secret.name == "API_KEY") & (Secret.workspace_id == a)) is None
    assert await Secret.aget_or_none((Secret.name == "API_KEY") & Secret.workspace_id.is_null()) is not None

    # the audit entries are the workspace's (its chain), never with the value
    entries = await client.app.ctx.core.db.list(
        AuditEntry.select().where(AuditEntry.action.startswith("secret.")).order_by(AuditEntry.at, AuditEntry.seq))
    ours = [(e.chain, e.action) for e in entries if e.chain == a]
    assert ours == [(a, "secret.create"), (a, "secret.update"), (a, "secret.delete")]
    assert all(e.chain != a for e in entries if e.actor_name == "admin")
    assert TEAM_VALUE not in json.dumps([e.changes for e in entries])
    log = await client.get("/api/v1/audit", params={"workspace_id": a, "action": "secret.create"},
                           headers=team["alice"]["headers"])
    assert log.status_code == 200, log.text
    [entry] = log.json()["entries"]
    assert entry["workspace_id"] == a and entry["changes"]["value"]["to"] == "***"


async def test_a_run_sends_its_workspace_secret_over_the_instance_one(client, team, target):
    assert (await store(client, team["admin"], "API_KEY", INSTANCE_VALUE, ["127.0.0.1"])).status_code == 201
    assert (await store(client, team["bob"], "API_KEY", TEAM_VALUE, ["127.0.0.1"], team["a"])).status_code == 201
    steps = sending(target.url + "/echo")
    in_a = await template_in(client, team["carol"], steps, team["a"])
    assert in_a.status_code == 201, in_a.text
    run = await run_of(client, team["carol"], in_a.json()["template_id"])
    assert run["status"] == "succeeded", run.get("error")
    assert target.requests[-1]["headers"]["x-k"] == TEAM_VALUE
    text = await stored_text(client, run["trace_id"]) + json.dumps(run)
    assert TEAM_VALUE not in text and "***" in text  # the echoed header is redacted too
    # a template elsewhere (eve's personal workspace) sends the instance-wide one
    elsewhere = await template_in(client, team["eve"], steps)
    assert elsewhere.status_code == 201, elsewhere.text
    run = await run_of(client, team["eve"], elsewhere.json()["template_id"])
    assert run["status"] == "succeeded", run.get("error")
    assert target.requests[-1]["headers"]["x-k"] == INSTANCE_VALUE


async def test_another_workspace_never_finds_the_secret(client, team, target):
    assert (await store(client, team["bob"], "ONLY_A", TEAM_VALUE, ["127.0.0.1"], team["a"])).status_code == 201
    steps = sending(target.url + "/echo", "ONLY_A")
    # bob is admin of A and owner of B: in B the secret is unknown, as one nobody stored
    refused = await template_in(client, team["bob"], steps, team["b"])
    assert refused.status_code == 422, refused.text
    assert [d["field"] for d in refused.json()["detail"]] == ["steps.0.http.headers.X-K"]
    nobody = await template_in(client, team["bob"], sending(target.url + "/echo", "NOBODY"), team["b"])
    assert refused.json()["detail"][0]["problem"].replace("ONLY_A", "N") == \
        nobody.json()["detail"][0]["problem"].replace("NOBODY", "N")
    for workspace_id, valid in ((team["b"], False), (team["a"], True)):
        checked = await client.post(f"{API}/template/check", headers=team["bob"]["headers"],
                                    json={"name": "t", "steps": steps, "workspace_id": workspace_id})
        assert checked.status_code == 200 and checked.json()["valid"] is valid, checked.text
    assert (await template_in(client, team["bob"], steps, team["a"])).status_code == 201
    # the host from the run's data: the save cannot tell, the run fails before any byte leaves
    late = [{"id": "call", "http": {"method": "GET", "url": "{{ input }}/echo",
                                    "headers": {"X-K": "{{ secrets.ONLY_A }}"}}}]
    saved = await template_in(client, team["bob"], late, team["b"])
    assert saved.status_code == 201, saved.text
    before = len(target.requests)
    run = await run_of(client, team["bob"], saved.json()["template_id"], input=target.url)
    assert run["status"] == "failed"
    assert "the secret 'ONLY_A' may not be sent" in run["error"], run["error"]
    assert len(target.requests) == before
    assert TEAM_VALUE not in await stored_text(client, run["trace_id"])


async def test_deleting_the_workspace_deletes_its_secrets(client, team):
    assert (await store(client, team["bob"], "API_KEY", TEAM_VALUE, ["127.0.0.1"], team["a"])).status_code == 201
    assert (await store(client, team["bob"], "API_KEY", TEAM_VALUE, ["127.0.0.1"], team["b"])).status_code == 201
    deleted = await client.delete(f"{WS}/{team['a']}", headers=team["alice"]["headers"])
    assert deleted.status_code == 200, deleted.text
    rows = await client.app.ctx.core.db.list(Secret.select())
    assert [(r.name, r.workspace_id) for r in rows] == [("API_KEY", team["b"])]
