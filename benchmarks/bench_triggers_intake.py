"""Machine access and triggers (issue 26's figures), against one real `orchestra serve`:

1. webhook intake — signed per Standard Webhooks, verified, run stored and queued —
   requests/s (202s only; any other answer is printed), against `POST /workflow/run` with a bearer access token, same template
   (one human step: no provider is called)        goal: hooks >= 0.8x POST /run
2. the cost of an API-key request over an access-token request: `GET
   /workflow/template/{id}` with each, requests/s   goal: key costs < 10 % more

Closed-loop load from keep-alive connections on loopback, phases alternated round by
round (the machine is shared and noisy), medians quoted. Every webhook request is signed
beforehand with its own webhook-id (so each one starts a run; none is a replay).

    python benchmarks/bench_triggers_intake.py [--rounds 3] [--seconds 4] [--connections 16]
        [--pg postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import sys
import time
import uuid
from pathlib import Path

import httpx
from standardwebhooks import Webhook

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_auth import _parse_head  # noqa: E402
from benchmarks.common import median, orchestra_cli, orchestra_server, report  # noqa: E402

MAX_REQUESTS = 200_000


def request_bytes(method: str, path: str, host: str, headers: dict[str, str], body: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: keep-alive"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def load(host: str, port: int, requests, connections: int, seconds: float) -> tuple[float, dict]:
    """Requests/s over `seconds` from `connections` connections taking `requests` in turn."""
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.monotonic() < deadline and sum(statuses.values()) < MAX_REQUESTS:
                writer.write(next(requests))
                status, length = _parse_head((await reader.readuntil(b"\r\n\r\n"))[:-4])
                await reader.readexactly(length)
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    start = time.monotonic()
    await asyncio.gather(*(connection() for _ in range(connections)))
    return time.monotonic() - start, statuses


def signed_calls(host: str, path: str, secret: str, count: int):
    """`count` distinct signed webhook calls (signed now: valid for 5 minutes)."""
    verifier = Webhook(secret)
    now = dt.datetime.now(dt.UTC)
    stamp = str(int(now.timestamp()))
    calls = []
    for n in range(count):
        msg_id = f"msg_{uuid.uuid4().hex}"
        body = json.dumps({"n": n, "text": "new order"}).encode()
        calls.append(request_bytes("POST", path, host, {
            "Content-Type": "application/json", "webhook-id": msg_id, "webhook-timestamp": stamp,
            "webhook-signature": verifier.sign(msg_id, now, body.decode())}, body))
    return iter(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--pg", default="", help="run on this PostgreSQL database instead of SQLite")
    args = parser.parse_args()
    env = {"ORCHESTRA_RATE_LIMIT_HOOK": "10000000/minute", "ORCHESTRA_ARGON2_MEMORY_COST": "1024",
           "ORCHESTRA_ARGON2_TIME_COST": "1"}
    if args.pg:
        env["ORCHESTRA_DATABASE_URL"] = args.pg
    with orchestra_server(env) as (base, _proc, full_env):
        orchestra_cli(full_env, "user", "create", "bench", "--role", "USER", "--password-stdin",
                      input="password-123\n")
        token = httpx.post(f"{base}/api/v1/auth/login",
                           json={"user_name": "bench", "password": "password-123"}).json()["access_token"]
        http = httpx.Client(base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)
        steps = [{"id": "h", "agent": {"human": True}, "prompt": "About {{input}}?"}]
        template = http.post("/workflow/template", json={"name": "intake", "steps": steps}).json()["template_id"]
        hook = http.post("/workflow/hook", json={"template_id": template, "input": "body.text"}).json()
        key = http.post("/auth/key", json={"name": "bench", "scopes": ["template:read", "run:start"]}).json()["key"]
        url = httpx.URL(base)
        host, port, hostport = url.host, url.port, f"{url.host}:{url.port}"
        run_body = json.dumps({"template_id": template, "input": "new order"}).encode()
        run_request = request_bytes("POST", "/api/v1/workflow/run", hostport, {
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"}, run_body)
        read_path = f"/api/v1/workflow/template/{template}"
        with_token = request_bytes("GET", read_path, hostport, {"Authorization": f"Bearer {token}"}, None)
        with_key = request_bytes("GET", read_path, hostport, {"Authorization": f"Bearer {key}"}, None)
        expected = {"run": 202, "hook": 202, "token": 200, "key": 200}
        rates: dict[str, list[float]] = {name: [] for name in expected}
        for round_ in range(args.rounds):
            phases = ["run", "hook", "token", "key"] if round_ % 2 == 0 else ["hook", "run", "key", "token"]
            for name in phases:
                requests = {
                    "run": lambda: itertools.repeat(run_request),
                    "hook": lambda: signed_calls(hostport, f"/api/v1/hooks/{hook['hook_id']}", hook["secret"],
                                                 int(args.seconds * 2000)),
                    "token": lambda: itertools.repeat(with_token),
                    "key": lambda: itertools.repeat(with_key),
                }[name]()
                took, statuses = asyncio.run(load(host, port, requests, args.connections, args.seconds))
                rate = statuses.get(expected[name], 0) / took  # only the answers wanted count
                others = {s: n for s, n in statuses.items() if s != expected[name]}
                rates[name].append(rate)
                print(f"round {round_ + 1} {name:<6} {rate:9.1f} req/s"
                      + (f"   other answers: {others}" if others else ""), flush=True)
        run_rate, hook_rate = median(rates["run"]), median(rates["hook"])
        token_rate, key_rate = median(rates["token"]), median(rates["key"])
        report("POST /workflow/run (bearer token) median", run_rate, "req/s")
        report("POST /hooks/{id} (signed, verified, queued) median", hook_rate, "req/s")
        report("webhook intake / POST /run", hook_rate / run_rate, "x", ">= 0.8")
        report("GET template with an access token median", token_rate, "req/s")
        report("GET template with an API key median", key_rate, "req/s")
        report("API-key request cost over access token", (token_rate / key_rate - 1) * 100, "%", "< 10")


if __name__ == "__main__":
    main()
