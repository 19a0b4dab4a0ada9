"""Auth benchmark (issues 2 and 24): the auth API against a bare Sanic baseline, a FastAPI
peer and the argon2 bound.

One run measures, against real server processes on loopback (one worker each, the
default argon2 parameters, ORCHESTRA_METRICS on):

1. the request path: requests/s of the protected `GET /api/v1/auth/list`
   (super-administrator token, 20 users in the store), four servers measured in
   alternating rounds of the same length (medians of the rounds' ratios):
     orchestra on SQLite : bare Sanic JSON route (bare_sanic.py)     goal >= 0.6
     orchestra on PostgreSQL : bare Sanic                           goal >= 0.5
     orchestra on SQLite : the FastAPI peer (fastapi_peer.py)       goal >= 3
   (PostgreSQL: a fresh database on --pg, dropped afterwards; the peer needs the
   `bench` extra. Either is left out, and said so, when it cannot be had.)
2. logins/s over the argon2 bound: verifications/s of a plain ThreadPoolExecutor on
   all cores in this process while the server is idle           goal >= 0.9
3. p99 latency of a cheap route (bad token -> 401) while logins flood the server:
   a flood that fills the hashing queue (64 connections)         goal < 20 ms
   and, for the record, one far past it (128 connections that ignore Retry-After)
Server CPU per request (from /proc) is printed too: it is steadier than requests/s
when other processes share the machine.
Load comes from `wrk` (one thread) when it is installed, else from an asyncio
raw-socket generator; the script says which one ran. Every phase is bounded in time
(`--seconds`) and count. Run from the project root: `python benchmarks/bench_auth.py`
(`--only-request-path` for the three figures of (1) alone).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx
from argon2 import PasswordHasher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    ROOT,
    free_port,
    median,
    orchestra_cli,
    orchestra_server,
    percentile,
    report,
    rss_bytes,
    stop,
    wait_until_up,
)

ADMIN = ("bench_admin", "bench-admin-password")
USERS = 19  # plus the administrator: 20 users in the store
MAX_REQUESTS = 2_000_000  # a hard bound on any one phase, whatever the speed


@dataclass
class Load:
    """What one load phase did."""

    requests: int
    seconds: float
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0

    def rate(self, status: int | None = None) -> float:
        count = self.requests if status is None else self.statuses.get(status, 0)
        return count / self.seconds if self.seconds else 0.0


# --- load generators ------------------------------------------------------------------

WRK_LUA = """
wrk.method = {method}
wrk.body = {body}
wrk.headers["Authorization"] = {auth}
wrk.headers["Content-Type"] = "application/json"
local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args) counts = {{}} end
{response}
function done(summary, latency, requests)
  local merged = {{}}
  for _, t in ipairs(threads) do
    local c = t:get("counts") or {{}}
    for k, v in pairs(c) do merged[k] = (merged[k] or 0) + v end
  end
  local parts = {{}}
  for k, v in pairs(merged) do table.insert(parts, string.format('"%d": %d', k, v)) end
  local e = summary.errors
  io.write(string.format('RESULT {{"requests": %d, "us": %d, "errors": %d, "statuses": {{%s}}}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout,
    table.concat(parts, ", ")))
end
"""

COUNT_STATUSES = "function response(status, headers, body) counts[status] = (counts[status] or 0) + 1 end"


def _lua_str(value: str | None) -> str:
    return "nil" if value is None else json.dumps(value)


def run_wrk(url: str, *, method: str = "GET", body: str | None = None, token: str | None = None,
            connections: int, seconds: float, count_statuses: bool) -> Load:
    """One wrk thread against `url` for `seconds`; per-status counts when asked."""
    script = WRK_LUA.format(
        method=_lua_str(method), body=_lua_str(body),
        auth=_lua_str(f"Bearer {token}" if token else None),
        response=COUNT_STATUSES if count_statuses else "",
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    try:
        done = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
             "-s", handle.name, url],
            capture_output=True, text=True, timeout=seconds + 30, check=True,
        )
    finally:
        os.unlink(handle.name)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    data = json.loads(line[len("RESULT "):])
    return Load(data["requests"], data["us"] / 1e6,
                {int(k): v for k, v in data["statuses"].items()}, data["errors"])


def raw_request(method: str, path: str, host: str, *, body: str | None = None,
                token: str | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: keep-alive"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    data = (body or "").encode()
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def _parse_head(head: bytes) -> tuple[int, int]:
    """(status, content length) of a response head."""
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return int(status_line.split()[1]), length


async def _async_exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          request: bytes) -> int:
    writer.write(request)
    status, length = _parse_head((await reader.readuntil(b"\r\n\r\n"))[:-4])
    await reader.readexactly(length)
    return status


async def _async_load(url: str, request: bytes, connections: int, seconds: float) -> Load:
    parsed = httpx.URL(url)
    statuses: dict[int, int] = {}
    errors = 0
    deadline = time.monotonic() + seconds

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
        try:
            while time.monotonic() < deadline and sum(statuses.values()) < MAX_REQUESTS:
                status = await _async_exchange(reader, writer, request)
                statuses[status] = statuses.get(status, 0) + 1
        except (OSError, asyncio.IncompleteReadError):
            errors += 1
        finally:
            writer.close()

    start = time.monotonic()
    await asyncio.gather(*(connection() for _ in range(connections)))
    return Load(sum(statuses.values()), time.monotonic() - start, statuses, errors)


def run_load(generator: str, url: str, *, method: str = "GET", body: str | None = None,
             token: str | None = None, connections: int, seconds: float,
             count_statuses: bool = False) -> Load:
    """Closed-loop load from `connections` keep-alive connections for `seconds`."""
    if generator == "wrk":
        return run_wrk(url, method=method, body=body, token=token, connections=connections,
                       seconds=seconds, count_statuses=count_statuses)
    parsed = httpx.URL(url)
    request = raw_request(method, parsed.raw_path.decode(), f"{parsed.host}:{parsed.port}",
                          body=body, token=token)
    return asyncio.run(_async_load(url, request, connections, seconds))


def probe_latencies(url: str, *, seconds: float, interval: float) -> tuple[list[float], dict[int, int]]:
    """Paced GETs with a bad token on one keep-alive socket: latencies in ms, statuses."""
    parsed = httpx.URL(url)
    request = raw_request("GET", parsed.raw_path.decode(), f"{parsed.host}:{parsed.port}",
                          token="not-a-valid-token")
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    with socket.create_connection((parsed.host, parsed.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = sock.makefile("rb")
        deadline = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < deadline and len(latencies) < 100_000:
            started = time.perf_counter()
            sock.sendall(request)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += stream.readline()
            status, length = _parse_head(head[:-4])
            stream.read(length)
            latencies.append((time.perf_counter() - started) * 1000)
            statuses[status] = statuses.get(status, 0) + 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    return latencies, statuses


def probe_during_flood(generator: str, login_url: str, login_body: str, probe_url: str,
                       connections: int, seconds: float) -> tuple[list[float], Load]:
    """Probe latencies (ms) while `connections` keep posting logins; and the flood's Load."""
    result: dict[str, Load] = {}
    flood = threading.Thread(target=lambda: result.update(load=run_load(
        generator, login_url, method="POST", body=login_body,
        connections=connections, seconds=seconds + 2, count_statuses=True)))
    flood.start()
    time.sleep(1.0)  # let the flood fill the hashing queue; it goes on 1 s after the probes
    latencies, _ = probe_latencies(probe_url, seconds=seconds, interval=0.01)
    flood.join(timeout=seconds + 60)
    return latencies, result["load"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the argon2 bound -----------------------------------------------------------------


def argon2_bound(seconds: float) -> tuple[float, int]:
    """Verifications/s with argon2-cffi's default parameters on all cores: (rate, workers)."""
    hasher = PasswordHasher()
    stored = hasher.hash(ADMIN[1])
    workers = os.cpu_count() or 1
    done = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        start = time.monotonic()
        deadline = start + seconds
        pending = {pool.submit(hasher.verify, stored, ADMIN[1]) for _ in range(workers * 2)}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            done += len(finished)
            if time.monotonic() < deadline and done < 100_000:
                pending |= {pool.submit(hasher.verify, stored, ADMIN[1]) for _ in finished}
        elapsed = time.monotonic() - start
    return done / elapsed, workers


# --- servers --------------------------------------------------------------------------


@contextmanager
def bare_sanic() -> Iterator[tuple[str, subprocess.Popen]]:
    """benchmarks/bare_sanic.py on a free port, one worker."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "bare_sanic.py"), "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/api/v1/auth/list", proc)
        yield base, proc
    finally:
        stop(proc)


@contextmanager
def fastapi_peer() -> Iterator[tuple[str, subprocess.Popen, str]]:
    """benchmarks/fastapi_peer.py on a free port with 20 users: (base, process, admin token)."""
    with tempfile.TemporaryDirectory(prefix="orchestra-peer-") as tmp:
        port = free_port()
        token_file = Path(tmp) / "token"
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / "fastapi_peer.py"), "--port", str(port),
             "--db", str(Path(tmp) / "peer.db"), "--users", str(USERS + 1),
             "--token-file", str(token_file)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(f"{base}/api/v1/auth/list", proc)
            token = token_file.read_text()
            listed = httpx.get(f"{base}/api/v1/auth/list", headers={"Authorization": f"Bearer {token}"})
            assert listed.status_code == 200 and len(listed.json()["users"]) == USERS + 1, listed.text
            yield base, proc, token
        finally:
            stop(proc)


@contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A fresh database on the PostgreSQL server at `admin_url`, dropped afterwards."""
    from benchmarks.bench_scale import _admin_sql

    name = f"orchestra_bench_auth_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin_sql(admin_url, f'CREATE DATABASE "{name}"'))
    try:
        yield urlunparse(urlparse(admin_url)._replace(path=f"/{name}"))
    finally:
        asyncio.run(_admin_sql(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def populate(base: str, env: dict[str, str]) -> str:
    """The administrator (from the CLI, same home) and USERS more; the admin's access token."""
    orchestra_cli(env, "user", "create", ADMIN[0], "--role", "SUPER_ADMINISTRATOR",
                  "--password-stdin", input=ADMIN[1] + "\n")
    with httpx.Client(base_url=base, timeout=30) as client:
        for n in range(USERS):
            answer = client.post("/api/v1/auth/register",
                                 json={"user_name": f"bench_user_{n:02d}", "password": f"password-{n:04d}"})
            answer.raise_for_status()
        answer = client.post("/api/v1/auth/login", json={"user_name": ADMIN[0], "password": ADMIN[1]})
        answer.raise_for_status()
        token = answer.json()["access_token"]
        listed = client.get("/api/v1/auth/list", headers={"Authorization": f"Bearer {token}"})
        listed.raise_for_status()
        assert len(listed.json()["users"]) == USERS + 1, listed.text
    return token


# --- the run --------------------------------------------------------------------------


@dataclass
class Side:
    """One server of the request path: where its /list is and who may call it."""

    name: str
    url: str
    token: str | None
    proc: subprocess.Popen
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    def measure(self, generator: str, connections: int, seconds: float) -> float:
        before = cpu_seconds(self.proc.pid)
        load = run_load(generator, self.url, token=self.token, connections=connections,
                        seconds=seconds, count_statuses=True)
        if load.errors or set(load.statuses) - {200}:
            print(f"  warning: {self.name} answered {load.statuses}, {load.errors} socket errors")
        self.cpu_us.append((cpu_seconds(self.proc.pid) - before) / max(load.requests, 1) * 1e6)
        self.rates.append(load.rate(200))
        return self.rates[-1]


def request_path(args, generator: str) -> None:
    """(1) The protected /list on SQLite and on PostgreSQL against bare Sanic, and on
    SQLite against the FastAPI peer: every round measures the four servers one after
    the other (the order turning each round), so load from elsewhere on the machine
    falls on all of them alike; each figure is the median of its rounds' ratios."""
    print(f"request path: {args.path_rounds} rounds of {args.path_seconds:g} s per server, "
          f"{args.connections} connections", flush=True)
    env = {"ORCHESTRA_ACCESS_TTL": "3600", "ORCHESTRA_METRICS": "1"}
    with ExitStack() as stack:
        bare_base, bare_proc = stack.enter_context(bare_sanic())
        sides = [Side("bare sanic", f"{bare_base}/api/v1/auth/list", None, bare_proc)]
        base, proc, full_env = stack.enter_context(orchestra_server(env))
        sides.append(Side("orchestra sqlite", f"{base}/api/v1/auth/list", populate(base, full_env), proc))
        if args.pg:
            try:
                pg_url = stack.enter_context(postgres_database(args.pg))
            except Exception as exc:  # noqa: BLE001 - said below, and the rest still runs
                print(f"  PostgreSQL left out: {exc!r}")
            else:
                base, proc, full_env = stack.enter_context(
                    orchestra_server({**env, "ORCHESTRA_DATABASE_URL": pg_url}))
                sides.append(Side("orchestra postgres", f"{base}/api/v1/auth/list",
                                  populate(base, full_env), proc))
        if importlib.util.find_spec("fastapi"):
            base, proc, token = stack.enter_context(fastapi_peer())
            sides.append(Side("fastapi peer", f"{base}/api/v1/auth/list", token, proc))
        else:
            print("  FastAPI peer left out: install the bench extra (pip install -e '.[bench]')")
        for side in sides:  # warm up: first requests, caches, the copy of the users
            run_load(generator, side.url, token=side.token, connections=args.connections, seconds=1)
        for round_ in range(args.path_rounds):
            turn = round_ % len(sides)
            for side in sides[turn:] + sides[:turn]:
                side.measure(generator, args.connections, args.path_seconds)
        by_name = {side.name: side for side in sides}
        for side in sides:
            print(f"  {side.name:<20} req/s {[round(r) for r in side.rates]}  "
                  f"CPU/request {[round(c) for c in side.cpu_us]} us")
            report(f"{side.name} GET /list (20 users)", median(side.rates), "req/s")
        goals = [("orchestra sqlite", "bare sanic", ">= 0.6"), ("orchestra postgres", "bare sanic", ">= 0.5"),
                 ("orchestra sqlite", "fastapi peer", ">= 3")]
        for top, bottom, goal in goals:
            if top in by_name and bottom in by_name:
                ratios = [a / b for a, b in zip(by_name[top].rates, by_name[bottom].rates, strict=True) if b]
                report(f"ratio {top} : {bottom}", median(ratios), "x", goal)
        # Server CPU per request is steadier than requests/s on a shared machine.
        for side in sides:
            report(f"{side.name} server CPU per request", median(side.cpu_us), "us")
        for top, bottom, _ in goals:
            if top in by_name and bottom in by_name:
                report(f"CPU ratio {bottom} : {top} per request",
                       median(by_name[bottom].cpu_us) / median(by_name[top].cpu_us), "x")



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measuring round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per comparison")
    parser.add_argument("--connections", type=int, default=32, help="connections for /list")
    parser.add_argument("--login-connections", type=int, default=6, help="connections for logins/s")
    parser.add_argument("--flood-connections", type=int, default=64,
                        help="connections of the login flood (default: fills the hashing queue)")
    parser.add_argument("--storm-connections", type=int, default=128,
                        help="connections of the flood past the queue (503s); 0 to skip")
    parser.add_argument("--generator", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--path-rounds", type=int, default=9,
                        help="alternating rounds of the request path's four servers")
    parser.add_argument("--path-seconds", type=float, default=2.0,
                        help="length of one server's turn in a request-path round (short turns, "
                             "many rounds: other load on the machine falls on all sides alike)")
    parser.add_argument("--pg", default=os.environ.get("ORCHESTRA_TEST_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/test"),
                        help="a PostgreSQL server to make the request path's database on ('' to skip)")
    parser.add_argument("--only-request-path", action="store_true",
                        help="measure (1) only: the three ratios of the request path")
    args = parser.parse_args()
    generator = args.generator
    if generator == "auto":
        generator = "wrk" if shutil.which("wrk") else "python"
    seconds, rounds = args.seconds, args.rounds
    print(f"load generator: {generator}; {os.cpu_count()} cores; {rounds} alternating rounds "
          f"of {seconds:.0f} s per comparison; medians", flush=True)

    request_path(args, generator)
    if args.only_request_path:
        return 0

    with orchestra_server({"ORCHESTRA_ACCESS_TTL": "3600"}) as (base, proc, env):
        populate(base, env)
        list_url, login_url = f"{base}/api/v1/auth/list", f"{base}/api/v1/auth/login"
        login_body = json.dumps({"user_name": ADMIN[0], "password": ADMIN[1]})
        # (2) logins/s against the argon2 bound, alternating; the bound while the server idles.
        bounds, login_rates = [], []
        for _ in range(rounds):
            bound, workers = argon2_bound(seconds)
            bounds.append(bound)
            logins = run_load(generator, login_url, method="POST", body=login_body,
                              connections=args.login_connections, seconds=seconds * 2,
                              count_statuses=True)
            login_rates.append(logins.rate(200))
            time.sleep(args.login_connections / bound)  # let abandoned logins finish hashing
        print(f"  bound: {[round(r, 2) for r in bounds]}  logins: {[round(r, 2) for r in login_rates]}")
        report(f"argon2 bound ({workers} threads, default params)", median(bounds), "verify/s")
        report(f"logins/s ({args.login_connections} connections)", median(login_rates), "login/s")
        report("ratio logins : argon2 bound", median(login_rates) / median(bounds), "x", ">= 0.9")

        # (3) a cheap route's latency: idle, then while logins flood the server.
        idle, _ = probe_latencies(list_url, seconds=seconds, interval=0.01)
        report("cheap route p99, server idle", percentile(idle, 99), "ms")
        time.sleep(args.login_connections / median(bounds))
        flood_seconds = seconds * rounds
        floods = [("login flood", args.flood_connections, "< 20")]
        if args.storm_connections:
            floods.append(("flood past the queue", args.storm_connections, None))
        for label, connections, goal in floods:
            latencies, flooded = probe_during_flood(generator, login_url, login_body, list_url,
                                                    connections, flood_seconds)
            report(f"cheap route p50 during {label} ({connections} conn)", median(latencies), "ms")
            report(f"cheap route p99 during {label} ({connections} conn)",
                   percentile(latencies, 99), "ms", goal)
            print(f"  {len(latencies)} probes, max {max(latencies):.1f} ms; flood answers "
                  f"{flooded.statuses}, socket errors {flooded.errors}; "
                  f"{flooded.rate(200):.2f} logins/s, {flooded.rate(503):.0f} 503/s", flush=True)
            time.sleep(connections / median(bounds))  # queued logins finish before the next
        report("server RSS after the run", rss_bytes(proc.pid) / 2**20, "MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
