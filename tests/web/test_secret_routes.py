"""`/api/v1/resource/secret` (SPEC §14, §15b): administrators store secrets with their
hosts; no route returns a value; templates may name them only in an HTTP step's url and
header values, and a URL that writes its host is refused at save when the secret may not
go there, with the sentence a secret that does not exist gets."""

from __future__ import annotations

import pytest

from orchestra.db.models import Secret

SECRETS = "/api/v1/resource/secret"
TEMPLATES = "/api/v1/workflow/template"
VALUE = "sk-live-0123456789abcd"


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


async def test_secret_crud_never_returns_the_value(client, admin):
    # the app's own Core: a second one (the `core` fixture) would take the models' binding,
    # and the app's write transaction (a secret and its audit entry) would wait on itself
    core = client.app.ctx.core
    created = await client.post(SECRETS, json={"name": "CRM_KEY", "value": VALUE, "hosts": ["CRM.example:443"]},
                                headers=admin["headers"])
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "CRM_KEY" and created.json()["hint"] == "…abcd"
    assert created.json()["hosts"] == ["crm.example:443"]
    assert VALUE not in created.text
    listed = await client.get(SECRETS, headers=admin["headers"])
    assert listed.status_code == 200 and VALUE not in listed.text
    assert [(s["name"], s["hint"], s["hosts"]) for s in listed.json()["secrets"]] == [
        ("CRM_KEY", "…abcd", ["crm.example:443"])]
    stored = await Secret.aget(Secret.name == "CRM_KEY")
    assert VALUE not in stored.value_encrypted and core.secrets.decrypt(stored.value_encrypted) == VALUE
    again = await client.post(SECRETS, json={"name": "CRM_KEY", "value": "other-value-1", "hosts": ["x.example"]},
                              headers=admin["headers"])
    assert again.status_code == 409 and again.json()["error"] == "ConflictError"
    replaced = await client.put(f"{SECRETS}/CRM_KEY", json={"value": "short"}, headers=admin["headers"])
    assert replaced.status_code == 200 and replaced.json()["hint"] == "…"
    assert replaced.json()["hosts"] == ["crm.example:443"]  # a new value keeps the hosts
    stored = await Secret.aget(Secret.name == "CRM_KEY")
    assert core.secrets.decrypt(stored.value_encrypted) == "short"
    moved = await client.put(f"{SECRETS}/CRM_KEY", json={"hosts": ["*.crm.example", "::1", "[::1]", "10.0.0.5:8443"]},
                             headers=admin["headers"])
    assert moved.status_code == 200 and moved.json()["hosts"] == ["*.crm.example", "[::1]", "10.0.0.5:8443"]
    stored = await Secret.aget(Secret.name == "CRM_KEY")
    assert stored.hosts == ["*.crm.example", "[::1]", "10.0.0.5:8443"]
    assert core.secrets.decrypt(stored.value_encrypted) == "short"  # new hosts keep the value
    empty = await client.put(f"{SECRETS}/CRM_KEY", json={}, headers=admin["headers"])
    assert empty.status_code == 422, empty.text
    gone = await client.delete(f"{SECRETS}/CRM_KEY", headers=admin["headers"])
    assert gone.status_code == 200 and await Secret.aget_or_none(Secret.name == "CRM_KEY") is None
    missing = await client.delete(f"{SECRETS}/CRM_KEY", headers=admin["headers"])
    assert missing.status_code == 404 and missing.json()["error"] == "NotFoundError"


async def test_secrets_need_an_administrator(client, user):
    for response in (
        await client.get(SECRETS, headers=user["headers"]),
        await client.post(SECRETS, json={"name": "K", "value": VALUE}, headers=user["headers"]),
        await client.delete(f"{SECRETS}/K", headers=user["headers"]),
    ):
        assert response.status_code == 403 and response.json()["error"] == "PermissionDeniedError"
    assert (await client.get(SECRETS)).status_code == 401


@pytest.mark.parametrize("body, field", [
    ({"name": "1BAD", "value": VALUE, "hosts": ["a.example"]}, "name"),
    ({"name": "has-dash", "value": VALUE, "hosts": ["a.example"]}, "name"),
    ({"name": "OK", "value": "ab", "hosts": ["a.example"]}, "value"),
    ({"name": "OK", "value": "line\nbreak", "hosts": ["a.example"]}, "value"),
    ({"name": "OK", "hosts": ["a.example"]}, "value"),
    ({"name": "OK", "value": VALUE}, "hosts"),  # required on create
    ({"name": "OK", "value": VALUE, "hosts": []}, "hosts"),
    ({"name": "OK", "value": VALUE, "hosts": ["has space.example"]}, "hosts"),
    ({"name": "OK", "value": VALUE, "hosts": ["*.com"]}, "hosts"),  # a wildcard needs a domain
    ({"name": "OK", "value": VALUE, "hosts": ["a.example:0"]}, "hosts"),
    ({"name": "OK", "value": VALUE, "hosts": ["a.example:65536"]}, "hosts"),
    ({"name": "OK", "value": VALUE, "hosts": ["https://a.example/"]}, "hosts"),
    ({"name": "OK", "value": VALUE, "hosts": ["a.example\n"]}, "hosts"),
    ({"name": "OK", "value": VALUE, "hosts": [f"h{i}.example" for i in range(51)]}, "hosts"),
])
async def test_bad_secrets_are_422(client, admin, core, body, field):
    response = await client.post(SECRETS, json=body, headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert any(d["field"].split(".")[0] == field for d in response.json()["detail"]), response.text
    assert await core.db.list(Secret.select()) == []


async def test_templates_name_secrets_only_in_http_urls_and_headers(client, admin, alice):
    await client.post(SECRETS, json={"name": "CRM_KEY", "value": VALUE, "hosts": ["crm.example", "x.example"]},
                      headers=admin["headers"])
    good = {"name": "crm", "steps": [{"id": "call", "http": {
        "method": "POST", "url": "https://crm.example/api?key={{ secrets.CRM_KEY }}",
        "headers": {"Authorization": "Bearer {{ secrets.CRM_KEY }}"}, "body": {"q": "{{ input }}"}}}]}
    response = await client.post(TEMPLATES, json=good, headers=alice["headers"])
    assert response.status_code == 201, response.text
    assert response.json()["template"]["steps"][0]["http"]["headers"]["Authorization"] == "Bearer {{ secrets.CRM_KEY }}"
    cases = [
        ({"id": "a", "agent": {"human": True}, "prompt": "say {{ secrets.CRM_KEY }}"}, "steps.0.prompt"),
        ({"id": "a", "http": {"method": "POST", "url": "https://x.example/",
                              "body": {"k": "{{ secrets.CRM_KEY }}"}}}, "steps.0.http.body.k"),
        ({"id": "a", "http": {"method": "GET", "url": "https://x.example/{{ secrets.NOPE }}"}}, "steps.0.http.url"),
        ({"id": "a", "when": "secrets.CRM_KEY == ''", "agent": {"human": True}, "prompt": "x"}, "steps.0.when"),
    ]
    for step, field in cases:
        response = await client.post(TEMPLATES, json={"name": "bad", "steps": [step]}, headers=alice["headers"])
        assert response.status_code == 422, (step, response.text)
        assert [d["field"] for d in response.json()["detail"]] == [field], response.text


async def test_workflow_steps_refuse_self_calls_and_deep_chains(client, alice, user):
    async def make(name, steps):
        return await client.post(TEMPLATES, json={"name": name, "steps": steps}, headers=alice["headers"])

    leaf = (await make("t1", [{"id": "a", "agent": {"human": True}, "prompt": "hi"}])).json()["template_id"]
    previous = leaf
    for level in range(2, 6):  # t2 calls t1, …, t5 calls t4: a chain of five runs
        made = await make(f"t{level}", [{"id": "call", "workflow": {"template": f"t{level - 1}", "input": "input"}}])
        assert made.status_code == 201, made.text
        assert made.json()["template"]["steps"][0]["workflow"]["template"] == previous  # a name is stored as the id
        previous = made.json()["template_id"]
    too_deep = await make("t6", [{"id": "call", "workflow": {"template": previous, "input": "input"}}])
    assert too_deep.status_code == 422 and too_deep.json()["detail"][0]["field"] == "steps.0.workflow.template"
    assert "5" in too_deep.json()["detail"][0]["problem"]
    # t1 calling t3 would be a cycle (t3 -> t2 -> t1)
    cycle = await client.put(f"{TEMPLATES}/{leaf}", json={"name": "t1", "steps": [
        {"id": "call", "workflow": {"template": "t3", "input": "input"}}]}, headers=alice["headers"])
    assert cycle.status_code == 422, cycle.text
    assert "itself" in cycle.json()["detail"][0]["problem"]
    own = await client.put(f"{TEMPLATES}/{leaf}", json={"name": "t1", "steps": [
        {"id": "call", "workflow": {"template": leaf, "input": "input"}}]}, headers=alice["headers"])
    assert own.status_code == 422 and "itself" in own.json()["detail"][0]["problem"]
    # another user's private template is unknown
    theirs = await client.post(TEMPLATES, json={"name": "x", "steps": [
        {"id": "call", "workflow": {"template": leaf, "input": "input"}}]}, headers=user["headers"])
    assert theirs.status_code == 422 and "unknown template" in theirs.json()["detail"][0]["problem"]
