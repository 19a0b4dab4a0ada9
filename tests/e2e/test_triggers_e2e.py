"""API keys, idempotent starts and inbound webhooks (SPEC §11) against real `orchestra
serve` processes: two on one PostgreSQL database for what must hold across processes
(exactly one run per webhook-id and per Idempotency-Key, racing included; a revoked key
refused on every process at once), one on SQLite for the refusals a sender sees over
real HTTP (401 with nothing written, 413 past exactly 1 MiB, 429 for one hook only)."""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from standardwebhooks import Webhook

from tests.conftest import ServerProcess
from tests.e2e.test_scale_out import Pair
from tests.e2e.test_workflow_e2e import login
from tests.fakes.fake_llm import FakeLLM

pytestmark = pytest.mark.e2e

EVENTS = 1000
REPLAYS = 300  # 30 %: 150 sent again later, 150 sent twice at the same time to both processes


def signed(secret: str, body: bytes, msg_id: str, at: float | None = None) -> dict:
    when = dt.datetime.fromtimestamp(time.time() if at is None else at, dt.UTC)
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": Webhook(secret).sign(msg_id, when, body.decode()),
            "content-type": "application/json"}


def all_runs(http: httpx.Client) -> list[dict]:
    runs, cursor = [], None
    while True:
        page = http.get("/workflow/run", params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        runs += page.json()["runs"]
        cursor = page.json()["next_cursor"]
        if not cursor:
            return runs


@pytest.fixture
def busy_pair(tmp_path, postgres_url):
    """Servers A and B on one PostgreSQL database, hooks not rate-limited in the way."""
    with FakeLLM() as fake:
        pair = Pair(tmp_path, postgres_url, fake, env={"ORCHESTRA_RATE_LIMIT_HOOK": "100000/minute"})
        try:
            yield pair
        finally:
            pair.stop()


def test_a_thousand_webhook_events_sent_1300_times_on_two_processes_start_1000_runs(busy_pair):
    pair = busy_pair
    _, worker = pair.provider_and_worker(pair.http_a)
    template = pair.template(pair.http_a, [{"id": "a", "agent": {"worker": worker}, "prompt": "{{input}}"}])
    hook = pair.http_a.post("/workflow/hook", json={"template_id": template, "input": "body.text"})
    assert hook.status_code == 201, hook.text
    hook_path, secret = f"/hooks/{hook.json()['hook_id']}", hook.json()["secret"]
    bodies = {f"evt_{i}": f'{{"text": "event {i}"}}'.encode() for i in range(EVENTS)}
    ids = list(bodies)
    later, racing = ids[:REPLAYS // 2], ids[REPLAYS // 2:REPLAYS]
    # (id, server): every event once, alternating A and B; racing ones also on the other
    # server in the same batch; the later ones again at the end.
    sends = []
    for n, msg_id in enumerate(ids):
        sends.append((msg_id, n % 2))
        if msg_id in racing:
            sends.append((msg_id, 1 - n % 2))
    sends += [(msg_id, n % 2) for n, msg_id in enumerate(later)]
    assert len(sends) == EVENTS + REPLAYS
    clients = [httpx.Client(base_url=s.base_url + "/api/v1", timeout=60) for s in (pair.a, pair.b)]
    answers: dict[str, list[tuple[int, str]]] = {}

    def send(item):
        msg_id, server = item
        body = bodies[msg_id]
        answer = clients[server].post(hook_path, content=body, headers=signed(secret, body, msg_id))
        return msg_id, answer.status_code, answer.json().get("trace_id"), answer.text

    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            for msg_id, status, trace_id, text in pool.map(send, sends):
                assert status in (200, 202), text
                answers.setdefault(msg_id, []).append((status, trace_id))
    finally:
        for client in clients:
            client.close()
    assert len(answers) == EVENTS
    for msg_id, got in answers.items():
        assert len({trace for _, trace in got}) == 1, (msg_id, got)
        assert [status for status, _ in got].count(202) == 1, (msg_id, got)
    runs = [r for r in all_runs(pair.http_b) if r["template_id"] == template]
    assert len(runs) == EVENTS
    assert {r["trace_id"] for r in runs} == {got[0][1] for got in answers.values()}
    webhook_ids = sorted(r["trigger"]["webhook_id"] for r in runs)
    assert webhook_ids == sorted(ids)
    detail = pair.http_b.get(f"/workflow/run/{answers['evt_7'][0][1]}").json()
    assert detail["input"] == "event 7"
    assert detail["trigger"] == {"kind": "webhook", "hook_id": hook.json()["hook_id"], "webhook_id": "evt_7"}


def test_one_idempotency_key_racing_on_two_processes_starts_one_run(pair):
    _, worker = pair.provider_and_worker(pair.http_a)
    template = pair.template(pair.http_a, [{"id": "a", "agent": {"worker": worker}, "prompt": "{{input}}"}])
    clients = [pair.http_a, pair.http_b]
    for round_ in range(5):
        key = f"nightly-{round_}-{uuid.uuid4().hex}"

        def start(n, key=key):
            return clients[n % 2].post("/workflow/run", headers={"Idempotency-Key": key},
                                       json={"template_id": template, "input": "x"})

        with ThreadPoolExecutor(max_workers=12) as pool:
            answers = list(pool.map(start, range(12)))
        assert sorted(a.status_code for a in answers) == [200] * 11 + [202], [a.text for a in answers]
        assert len({a.json()["trace_id"] for a in answers}) == 1
        assert all(a.headers.get("idempotent-replayed") == "true" for a in answers if a.status_code == 200)
    runs = [r for r in all_runs(pair.http_a) if r["template_id"] == template]
    assert len(runs) == 5


def test_a_revoked_key_is_refused_on_every_process_at_once(pair):
    root = pair.a.cli("user", "create", "root", "--role", "SUPER_ADMINISTRATOR", "--password-stdin",
                      input="password-123\n")
    assert root.returncode == 0, root.stderr
    made = pair.http_a.post("/auth/key", json={"name": "ci", "scopes": ["run:read"]})
    assert made.status_code == 201, made.text
    key = {"Authorization": f"Bearer {made.json()['key']}"}
    other = pair.http_a.post("/auth/key", json={"name": "other", "scopes": ["run:read"]}).json()
    other_key = {"Authorization": f"Bearer {other['key']}"}
    with httpx.Client(base_url=pair.a.base_url + "/api/v1", timeout=20) as bare_a, \
            httpx.Client(base_url=pair.b.base_url + "/api/v1", timeout=20) as bare_b:
        for _ in range(3):  # both processes have the keys in their copies now
            for bare in (bare_a, bare_b):
                assert bare.get("/workflow/run?all=1", headers=key).status_code == 200
                assert bare.get("/workflow/run", headers=other_key).status_code == 200
        assert pair.http_a.delete(f"/auth/key/{made.json()['key_id']}").status_code == 200
        for bare in (bare_b, bare_a):
            refused = bare.get("/workflow/run", headers=key)
            assert refused.status_code == 401 and refused.json()["error"] == "TokenInvalidError"
            assert bare.get("/workflow/run", headers=other_key).status_code == 200
        # the user demoted on A: the other key loses the administrator's rights on B at once
        admin_id = pair.http_a.get("/workflow/run", headers=other_key)  # warm
        assert admin_id.status_code == 200
        root_session = httpx.post(f"{pair.a.base_url}/api/v1/auth/login",
                                  json={"user_name": "root", "password": "password-123"}).json()
        root_headers = {"Authorization": f"Bearer {root_session['access_token']}"}
        users = httpx.get(f"{pair.a.base_url}/api/v1/auth/list", headers=root_headers).json()["users"]
        admin = next(u for u in users if u["user_name"] == "admin")
        assert bare_b.get("/workflow/run?all=1", headers=other_key).status_code == 200
        demoted = httpx.put(f"{pair.a.base_url}/api/v1/auth/authority", headers=root_headers,
                            json={"user_id": admin["user_id"], "new_authority": "USER"})
        assert demoted.status_code == 200, demoted.text
        assert bare_b.get("/workflow/run?all=1", headers=other_key).status_code == 403
        deleted = httpx.delete(f"{pair.a.base_url}/api/v1/auth/{admin['user_id']}", headers=root_headers)
        assert deleted.status_code == 200
        for bare in (bare_b, bare_a):
            assert bare.get("/workflow/run", headers=other_key).status_code == 401


def test_refusals_a_sender_sees_over_real_http(tmp_path):
    server = ServerProcess(tmp_path / "s", env={"ORCHESTRA_RATE_LIMIT_HOOK": "12/minute"}).start()
    try:
        headers = login(server, "alice")
        api = server.base_url + "/api/v1"
        with httpx.Client(base_url=api, headers=headers, timeout=30) as http, \
                httpx.Client(base_url=api, timeout=30) as sender:
            steps = [{"id": "h", "agent": {"human": True}, "prompt": "About {{input}}?"}]
            template = http.post("/workflow/template", json={"name": "t", "steps": steps}).json()["template_id"]
            hooks = [http.post("/workflow/hook", json={"template_id": template}).json() for _ in range(2)]
            flooded, quiet = hooks
            path = f"/hooks/{flooded['hook_id']}"
            body = b'{"a": 1}'
            for bad in ({}, signed("whsec_" + "QUJD" * 8, body, "m1"),
                        signed(flooded["secret"], body, "m2", at=time.time() - 400),
                        {**signed(flooded["secret"], body, "m3"), "webhook-signature": "v1,AAAA"}):
                refused = sender.post(path, content=body, headers=bad)
                assert refused.status_code == 401, refused.text
            exact = b'"' + b"x" * (1024 * 1024 - 2) + b'"'
            accepted = sender.post(path, content=exact, headers=signed(flooded["secret"], exact, "big"))
            assert accepted.status_code == 202, accepted.text[:200]
            over = exact[:-1] + b'x"'
            too_big = sender.post(path, content=over, headers=signed(flooded["secret"], over, "bigger"))
            assert too_big.status_code == 413 and too_big.json()["error"] == "PayloadTooLargeError"
            # nothing but the one accepted call was written
            store = sqlite3.connect(tmp_path / "s" / "orchestra.db")
            try:
                assert store.execute("SELECT count(*) FROM workflow_run").fetchone()[0] == 1
                assert store.execute("SELECT key FROM run_start_key").fetchall() == [("big",)]
            finally:
                store.close()
            codes = [sender.post(path, content=body, headers=signed(flooded["secret"], body, f"f{n}")).status_code
                     for n in range(12)]
            # 12 a minute of verified calls: the accepted one counted, 11 are left. The four
            # refused calls count against the sender's address (hook_unverified), never the
            # hook's own limit, so forged calls cannot use up a hook; the 413 was answered
            # by the server before the handler, as for every route
            assert codes == [202] * 11 + [429], codes
            limited = sender.post(path, content=body, headers=signed(flooded["secret"], body, "late"))
            assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
            other = sender.post(f"/hooks/{quiet['hook_id']}", content=body,
                                headers=signed(quiet["secret"], body, "q1"))
            assert other.status_code == 202, other.text
    finally:
        server.stop()
