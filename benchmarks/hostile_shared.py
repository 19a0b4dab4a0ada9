"""What users share (issue "Trust, second pass", SPEC §15b): another user's latency while
one user attacks the run slots, the store's pool, child trees, `/mcp` sessions and a hook.

Used by `bench_hostile.py` (`--part shared`). On one real `orchestra serve` per store
(SQLite in a temp home; PostgreSQL in a fresh database, dropped afterwards), with the
fake model in its own process on a priced provider, a plain USER runs each attack in
turn while a super administrator calls `GET /api/v1/auth/list` one request after
another (the victim; p50 and p99 printed, goal p99 < 100 ms):

- `waiting_500`: 500 runs of a one-question template started (8 at a time) and left
  waiting; meanwhile a third user's one-step run is started and its start-to-end time
  printed (it must not queue behind them);
- `foreach_64_budget`: a 64-item foreach at `max_concurrency` 64 under a budget that
  holds two reservations at a time (bench_budget.py's), to its end;
- `child_tree_16x16`: a top run whose foreach of 16 starts 16 `middle` runs of 16
  waiting `leaf` runs each (past ORCHESTRA_CHILD_TREE_MAX_ACTIVE, 256: the rest fail),
  held for a few seconds, then cancelled (the cancel's time printed, goal < 2 s);
- `mcp_1000_sessions`: 1,000 `/mcp` initialize requests (8 at a time), each a session;
- `hook_unsigned_flood`: unsigned calls to the user's hook for a few seconds (4 at a
  time), then one signed call, which must still be taken (202).

Every phase is bounded in time and count, and talks to loopback only.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from urllib.parse import urlparse, urlunparse

import httpx
from standardwebhooks import Webhook

from benchmarks.bench_scale import _admin_sql
from benchmarks.common import free_port, median, orchestra_cli, orchestra_server, percentile, report

ADMIN = ("bench_admin", "bench-admin-password")
HOSTILE = ("bench_hostile", "bench-hostile-password")
OTHER = ("bench_other", "bench-other-password")
SLOW = "from orchestra.testing.fake_llm import main; import sys; main(['--port', sys.argv[1], '--delay', '0.02'])"
PRICES = {"input_per_mtok": "10", "output_per_mtok": "1000"}
ACCEPT = {"Accept": "application/json, text/event-stream"}
MAX_SECONDS = 120  # a hard bound on any one phase


async def _login(client: httpx.AsyncClient, who: tuple[str, str]) -> dict[str, str]:
    answer = await client.post("/api/v1/auth/login", json={"user_name": who[0], "password": who[1]})
    answer.raise_for_status()
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


async def _made(answer: Awaitable[httpx.Response], key: str) -> str:
    done = await answer
    if done.status_code != 201:
        raise RuntimeError(f"{done.request.url.path}: {done.status_code} {done.text[:300]}")
    return done.json()[key]


async def _end(client: httpx.AsyncClient, auth: dict, trace_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = (await client.get(f"/api/v1/workflow/run/{trace_id}", headers=auth)).json()
        if run["status"] in ("succeeded", "failed", "cancelled", "interrupted") or time.monotonic() > deadline:
            return run
        await asyncio.sleep(0.02)


async def _phase(name: str, base: str, admin: dict, attack: Callable[[httpx.AsyncClient], Awaitable[str]],
                 *, at_least: float = 3.0) -> None:
    """The victim's latencies for as long as the attack runs (and `at_least` seconds)."""
    latencies: list[float] = []
    done = asyncio.Event()
    began = time.monotonic()

    async def victim(client: httpx.AsyncClient) -> None:
        while (not done.is_set() or time.monotonic() - began < at_least) and time.monotonic() - began < MAX_SECONDS:
            started = time.perf_counter()
            try:
                ok = (await client.get("/api/v1/auth/list", headers=admin, timeout=60)).status_code == 200
            except httpx.TransportError:
                ok = False
            latencies.append((time.perf_counter() - started) * 1000 if ok else float("inf"))
            await asyncio.sleep(0.01)

    async def attacker(client: httpx.AsyncClient) -> str:
        try:
            return await asyncio.wait_for(attack(client), MAX_SECONDS)
        finally:
            done.set()

    async with httpx.AsyncClient(base_url=base, timeout=120) as mine, \
            httpx.AsyncClient(base_url=base, timeout=120,
                              limits=httpx.Limits(max_connections=16)) as theirs:
        _, said = await asyncio.gather(victim(mine), attacker(theirs))
    report(f"{name}: victim p50", median(latencies), "ms")
    report(f"{name}: victim p99", percentile(latencies, 99), "ms", "< 100")
    print(f"  {name}: {said} ({len(latencies)} victim requests)", flush=True)


async def _bounded(count: int, width: int, one: Callable[[int], Awaitable[int]]) -> dict[int, int]:
    """`one(n)` for n < count, `width` at a time: how often each status was answered."""
    counts: dict[int, int] = {}
    numbers = iter(range(count))

    async def worker() -> None:
        for n in numbers:
            try:
                status = await one(n)
            except httpx.TransportError:
                status = 0
            counts[status] = counts.get(status, 0) + 1

    await asyncio.gather(*(worker() for _ in range(width)))
    return dict(sorted(counts.items()))


async def _attacks(base: str, fake_port: int) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=120) as c:
        admin, evil, other = (await _login(c, ADMIN), await _login(c, HOSTILE), await _login(c, OTHER))
        provider = await _made(c.post("/api/v1/provider", headers=admin, json={
            "name": "fake", "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
            "base_url": f"http://127.0.0.1:{fake_port}/v1", "prices": PRICES}), "provider_id")
        worker = await _made(c.post("/api/v1/agent/worker", headers=evil, json={
            "name": "w", "provider_id": provider}), "worker_id")
        tmpl = "/api/v1/workflow/template"
        asks = await _made(c.post(tmpl, headers=evil, json={
            "name": "asks", "steps": [{"id": "q", "agent": {"human": True}, "prompt": "Name?"}]}), "template_id")
        quick = await _made(c.post(tmpl, headers=other, json={
            "name": "quick", "steps": [{"id": "c", "code": {"source": "'done'"}}]}), "template_id")
        wide = await _made(c.post(tmpl, headers=evil, json={
            "name": "wide", "input_schema": {"type": "array"},
            "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": 64},
                       "agent": {"worker": worker}, "prompt": "item {{index}}: {{item}}"}]}), "template_id")
        await _made(c.post(tmpl, headers=evil, json={
            "name": "leaf", "steps": [{"id": "q", "agent": {"human": True}, "prompt": "Leaf?"}]}), "template_id")
        await _made(c.post(tmpl, headers=evil, json={"name": "middle", "steps": [{
            "id": "m", "foreach": {"items": str(list(range(16))), "max_concurrency": 16},
            "workflow": {"template": "leaf", "input": "string(item)"}, "on_error": "continue"}]}), "template_id")
        top = await _made(c.post(tmpl, headers=evil, json={"name": "top", "steps": [{
            "id": "t", "foreach": {"items": str(list(range(16))), "max_concurrency": 16},
            "workflow": {"template": "middle", "input": "string(item)"}, "on_error": "continue"}]}), "template_id")
        hook = (await c.post("/api/v1/workflow/hook", headers=evil,
                             json={"template_id": asks, "input": "body.text"})).json()

    async def waiting_500(c: httpx.AsyncClient) -> str:
        counts = await _bounded(500, 8, lambda n: _status(c.post(
            "/api/v1/workflow/run", headers=evil, json={"template_id": asks, "input": f"n{n}"})))
        began = time.perf_counter()
        run = await _end(c, other, (await c.post("/api/v1/workflow/run", headers=other, json={
            "template_id": quick, "input": "x"})).json()["trace_id"], timeout=30)
        took = (time.perf_counter() - began) * 1000
        report("waiting_500: another user's run, start to end", took, "ms")
        return f"starts answered {counts}; the other run {run['status']}"

    async def foreach_64(c: httpx.AsyncClient) -> str:
        trace_id = (await c.post("/api/v1/workflow/run", headers=evil, json={
            "template_id": wide, "budget_usd": "0.13", "input": [f"topic {n}" for n in range(64)]})).json()["trace_id"]
        run = await _end(c, evil, trace_id, timeout=90)
        paid = sum(1 for s in run["steps"] if s["path"].startswith("m[") and s["status"] == "succeeded")
        return f"the map {run['status']}, {paid} items paid for, cost ${run['cost_usd']}"

    async def tree(c: httpx.AsyncClient) -> str:
        root = (await c.post("/api/v1/workflow/run", headers=evil,
                             json={"template_id": top, "input": "go"})).json()["trace_id"]
        await asyncio.sleep(8)  # the tree grows to its cap and waits
        began = time.perf_counter()
        await c.post(f"/api/v1/workflow/cancel/{root}", headers=evil)
        run = await _end(c, evil, root, timeout=30)
        took = (time.perf_counter() - began) * 1000
        report("child_tree_16x16: cancel of the root, to its end", took, "ms", "< 2000")
        return f"root {run['status']}"

    async def mcp_1000(c: httpx.AsyncClient) -> str:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}})
        counts = await _bounded(1000, 8, lambda n: _status(c.post(
            "/mcp", headers={**evil, **ACCEPT, "Content-Type": "application/json"}, content=body)))
        return f"initialize answered {counts}"

    async def hook_flood(c: httpx.AsyncClient) -> str:
        path, until = f"/api/v1/hooks/{hook['hook_id']}", time.monotonic() + 5
        bogus = {"webhook-id": "msg_x", "webhook-timestamp": str(int(time.time())),
                 "webhook-signature": "v1,AAAA", "Content-Type": "application/json"}

        async def one(n: int) -> int:
            if time.monotonic() > until:
                return -1
            return await _status(c.post(path, headers=bogus, content=b'{"text": "x"}'))

        counts = await _bounded(20_000, 4, one)
        counts.pop(-1, None)
        now, msg = int(time.time()), f"msg_{uuid.uuid4().hex}"
        payload = '{"text": "signed"}'
        signed = await c.post(path, content=payload, headers={
            "Content-Type": "application/json", "webhook-id": msg, "webhook-timestamp": str(now),
            "webhook-signature": Webhook(hook["secret"]).sign(msg, _utc(now), payload)})
        return f"unsigned calls answered {counts}; then a signed call: {signed.status_code}"

    for name, attack in (("waiting_500", waiting_500), ("foreach_64_budget", foreach_64),
                         ("child_tree_16x16", tree), ("mcp_1000_sessions", mcp_1000),
                         ("hook_unsigned_flood", hook_flood)):
        await _phase(name, base, admin, attack)


def _utc(epoch: int):
    import datetime as dt
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


async def _status(answer: Awaitable[httpx.Response]) -> int:
    return (await answer).status_code


def run(stores: list[str], pg: str) -> None:
    """Every attack above, on each of `stores` ("sqlite", "postgres")."""
    for kind in stores:
        print(f"\nshared, {kind}", flush=True)
        env = {"ORCHESTRA_ACCESS_TTL": "3600", "ORCHESTRA_LLM_MAX_TOKENS": "60"}
        pg_url = name = None
        if kind == "postgres":
            name = f"orchestra_hostile_{uuid.uuid4().hex[:8]}"
            asyncio.run(_admin_sql(pg, f'CREATE DATABASE "{name}"'))
            pg_url = urlunparse(urlparse(pg)._replace(path=f"/{name}"))
            env["ORCHESTRA_DATABASE_URL"] = pg_url
        port = free_port()
        fake = subprocess.Popen([sys.executable, "-c", SLOW, str(port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            with orchestra_server(env) as (base, _proc, full_env):
                for who, role in ((ADMIN, ["--role", "SUPER_ADMINISTRATOR"]), (HOSTILE, []), (OTHER, [])):
                    orchestra_cli(full_env, "user", "create", who[0], *role, "--password-stdin",
                                  input=who[1] + "\n")
                asyncio.run(_attacks(base, port))
        finally:
            fake.terminate()
            fake.wait(timeout=10)
            if pg_url:
                asyncio.run(_admin_sql(pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
