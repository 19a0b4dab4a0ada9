"""What composition costs (SPEC §14, issue 28): a `workflow` step over running its child
directly, and an `http` step over a bare httpx call to the same loopback server.

1. Workflow-step overhead, on a real `orchestra serve` and a fresh PostgreSQL database:
   a one-step child template (an HTTP GET to a loopback server) started directly, and a
   parent whose one step is a `workflow` step calling that child, alternating, each
   timed from `POST /run` to its terminal event on the SSE stream. The overhead is the
   parent's p50 minus the child's (goal < 20 ms). On a shared machine wall times swing
   with its load, so the server's CPU per run (which load moves far less) is printed too.
2. HTTP-step overhead, in one process: the engine's HTTP step call path (render the URL
   and headers, read the secret it names from the store, send through the egress rule's
   transport, build `{status, headers, body}`, redact) against a bare pooled
   `httpx2.AsyncClient` GET of the same URL on the same loopback server, alternating,
   per call (goal < 2 ms p50, egress check included). Both clients pool connections, so
   the egress rule runs once per new connection; a `fresh` variant (a new connection
   for every call, the rule every time) is printed too.

    python benchmarks/bench_compose.py [--runs 40] [--calls 300] [--pg URL] [--baseline GIT_REF]

`--baseline REF` prints before/after in one run: a second server runs that commit's code
(`git archive`) on a database of its own, taking its turn between this tree's runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2  # noqa: E402

from benchmarks.bench_auth import populate  # noqa: E402
from benchmarks.bench_scale import _admin_sql  # noqa: E402
from benchmarks.common import (  # noqa: E402
    ROOT,
    free_port,  # noqa: E402
    median,
    orchestra_server,
    percentile,
    report,
)


class LoopbackTarget:
    """The loopback HTTP server (orchestra/testing/fake_http.py) in a process of its own."""

    def __init__(self) -> None:
        import subprocess

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestra.testing.fake_http", "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/echo", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("the loopback HTTP server did not start")

    def __enter__(self) -> LoopbackTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)

# --- 1. workflow step over its child run ------------------------------------------------


def timed_run(http: httpx.Client, template_id: str) -> float:
    """Seconds from POST /run to the run's terminal event (read on its SSE stream)."""
    began = time.perf_counter()
    started = http.post("/workflow/run", json={"template_id": template_id, "input": "x"})
    assert started.status_code == 202, started.text
    with http.stream("GET", f"/workflow/sse/{started.json()['trace_id']}") as response:
        for line in response.iter_lines():
            if line.startswith("event: run_"):
                kind = line.split(":", 1)[1].strip()
                if kind in ("run_finished", "run_failed", "run_cancelled"):
                    assert kind == "run_finished", kind
                    break
    return time.perf_counter() - began


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a process has used so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


KINDS = ("child directly", "parent (workflow step)")


@contextmanager
def compose_server(pg: str, target: LoopbackTarget, root: Path) -> Iterator[tuple[httpx.Client, int, dict[str, str]]]:
    """A server running the code under `root` on a fresh PostgreSQL database, with the
    child template and its parent: (client, server pid, {kind: template id})."""
    name = f"orchestra_compose_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin_sql(pg, f'CREATE DATABASE "{name}"'))
    pg_url = urlunparse(urlparse(pg)._replace(path=f"/{name}"))
    try:
        with orchestra_server({"ORCHESTRA_DATABASE_URL": pg_url, "ORCHESTRA_ACCESS_TTL": "3600"},
                              root=root) as (base, proc, env):
            token = populate(base, env)
            http = httpx.Client(base_url=base + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)
            child = http.post("/workflow/template", json={"name": "child", "steps": [
                {"id": "get", "http": {"method": "GET", "url": target.url + "/echo"}}]})
            assert child.status_code == 201, child.text
            parent = http.post("/workflow/template", json={"name": "parent", "steps": [
                {"id": "call", "workflow": {"template": "child", "input": "input"}}]})
            assert parent.status_code == 201, parent.text
            yield http, proc.pid, dict(zip(KINDS, (child.json()["template_id"], parent.json()["template_id"]),
                                           strict=True))
    finally:
        asyncio.run(_admin_sql(pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def source_tree(ref: str) -> Iterator[Path]:
    """The project's files at git `ref`, in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="orchestra-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def workflow_overhead(pg: str, runs: int, target: LoopbackTarget, baseline: str | None) -> None:
    """Both kinds of run, alternating; with `baseline`, a second server running that git
    ref's code takes its turns in between, so the load of the moment falls on both."""
    with ExitStack() as stack:
        roots = {"this tree": ROOT}
        if baseline:
            roots[f"baseline {baseline}"] = stack.enter_context(source_tree(baseline))
        sides = {label: stack.enter_context(compose_server(pg, target, root)) for label, root in roots.items()}
        for http, _, ids in sides.values():  # warm: connections, caches
            for template in ids.values():
                for _ in range(3):
                    timed_run(http, template)
        turns = [(side, kind) for side in sides for kind in KINDS]
        times: dict[tuple[str, str], list[float]] = {turn: [] for turn in turns}
        cpu = dict.fromkeys(turns, 0.0)  # the server's CPU seconds, per side and kind of run
        for n in range(runs):
            for side, kind in turns if n % 2 == 0 else reversed(turns):
                http, pid, ids = sides[side]
                began = cpu_seconds(pid)
                times[side, kind].append(timed_run(http, ids[kind]) * 1000)
                cpu[side, kind] += cpu_seconds(pid) - began
    print(f"workflow step over its child run, PostgreSQL, {runs} runs each, alternating:")
    for side in sides:
        child, parent = (side, KINDS[0]), (side, KINDS[1])
        print(f" {side}:")
        for kind in KINDS:
            report(f"  {kind} p50", median(times[side, kind]), "ms")
            report(f"  {kind} p99", percentile(times[side, kind], 99), "ms")
            report(f"  {kind} server CPU per run", cpu[side, kind] * 1000 / runs, "ms")
        # CPU is what a loaded machine cannot hide: the overhead's share that is work, not waits
        report("  workflow-step server CPU overhead per run", (cpu[parent] - cpu[child]) * 1000 / runs, "ms")
        report("  workflow-step overhead p50", median(times[parent]) - median(times[child]), "ms", "< 20 ms")
        report("  ratio parent/child p50", median(times[parent]) / median(times[child]), "x")


# --- 2. http step over a bare httpx call ------------------------------------------------


async def http_overhead(calls: int, target: LoopbackTarget) -> None:
    from orchestra.core import Core
    from orchestra.engine.live import LiveRun
    from orchestra.engine.model import At, step_defs
    from orchestra.language.expressions import Scope
    from orchestra.services import secrets
    from orchestra.settings import Settings
    from orchestra.tls import client_tls

    with tempfile.TemporaryDirectory(prefix="orchestra-bench-") as home:
        settings = Settings.from_env(env={}, home=Path(home), database_url=f"sqlite:///{home}/store.db",
                                     secret_key="bench-secret-" + "z" * 32, egress_allow=f"127.0.0.1:{target.port}")
        core = await Core.open(settings)
        try:
            await secrets.create_secret(core, name="TOKEN", value="bench-token-0123456789", hosts=["127.0.0.1"])
            engine = core.engine
            live = LiveRun(trace_id="bench", owner_id="bench", input="x", files=[], steps=())
            plain, secret = step_defs([
                {"id": "get", "http": {"method": "GET", "url": target.url + "/echo?q={{ input }}"}},
                {"id": "get", "http": {"method": "GET", "url": target.url + "/echo?q={{ input }}",
                                       "headers": {"Authorization": "Bearer {{ secrets.TOKEN }}"}}}])
            at = At.top("get")
            tls = client_tls()  # made once, as the step's client does
            bare = httpx2.AsyncClient(trust_env=False, verify=tls)
            url = target.url + "/echo?q=x"

            async def step_call(step) -> float:
                began = time.perf_counter()
                await engine.http_steps.attempt(live, step, at, Scope({"input": "x", "steps": {}}, engine.sandbox))
                return time.perf_counter() - began

            async def bare_call() -> float:
                began = time.perf_counter()
                response = await bare.get(url)
                response.json()
                return time.perf_counter() - began

            async def fresh_bare() -> float:
                began = time.perf_counter()
                async with httpx2.AsyncClient(trust_env=False, verify=tls) as once:
                    (await once.get(url)).json()
                return time.perf_counter() - began

            async def fresh_step() -> float:
                await engine.http_steps.close()  # a new pool: a new connection, the egress rule again
                return await step_call(plain)

            shapes = {"bare httpx": bare_call, "http step": lambda: step_call(plain),
                      "http step + secret": lambda: step_call(secret),
                      "bare httpx, fresh connection": fresh_bare, "http step, fresh connection": fresh_step}
            for shape in shapes.values():  # warm
                for _ in range(20):
                    await shape()
            times: dict[str, list[float]] = {k: [] for k in shapes}
            cpu: dict[str, float] = dict.fromkeys(shapes, 0.0)
            for n in range(calls):
                order = list(shapes.items()) if n % 2 == 0 else list(reversed(shapes.items()))
                for label, shape in order:
                    began = time.process_time()
                    times[label].append(await shape() * 1000)
                    cpu[label] += time.process_time() - began
            await bare.aclose()
        finally:
            await core.close()
    print(f"http step over a bare httpx call, one process, {calls} calls each, alternating:")
    for label, values in times.items():
        report(f"  {label} p50", median(values), "ms")
        report(f"  {label} CPU per call", cpu[label] * 1000 / calls, "ms")
    base = median(times["bare httpx"])
    report("  http-step overhead p50", median(times["http step"]) - base, "ms", "< 2 ms")
    report("  http-step (+ secret read) overhead p50", median(times["http step + secret"]) - base, "ms", "< 2 ms")
    report("  fresh-connection overhead p50 (egress check each call)",
           median(times["http step, fresh connection"]) - median(times["bare httpx, fresh connection"]), "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("ORCHESTRA_TEST_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--skip-workflow", action="store_true")
    parser.add_argument("--baseline", metavar="GIT_REF",
                        help="also run that commit's code in a second server, turn about (before/after)")
    args = parser.parse_args()
    with LoopbackTarget() as target:
        asyncio.run(http_overhead(args.calls, target))
        if not args.skip_workflow:
            workflow_overhead(args.pg, args.runs, target, args.baseline)


if __name__ == "__main__":
    main()
