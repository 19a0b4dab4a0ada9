"""1,000 concurrent SSE subscribers on one run that emits about 200 events.

A real `orchestra serve` process and a FakeLLM process on loopback. The run starts with
a human step, so every subscriber attaches while it waits; server memory is read before
and after attaching (memory per subscriber). The reply then releases a worker step that
streams, in two concurrent worker steps, ~200 token chunks 60 ms apart per step (each
becomes one `token` event). Delivery latency
of an event = the time a subscriber reads it − its `ts` (stored time, ms precision, same
clock). Goals: p99 latency under 100 ms, under 50 KiB of server memory per subscriber.

    python benchmarks/bench_sse.py [--subscribers 1000] [--chunks 195]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import free_port, median, orchestra_cli, orchestra_server, percentile, report, rss_bytes  # noqa: E402,E501


def _epoch(ts: str) -> float:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class Subscriber:
    """A raw-socket SSE reader: HTTP/1.1 GET, chunked body, frames parsed as they come."""

    def __init__(self, host: str, port: int, path: str, token: str) -> None:
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                        "Accept: text/event-stream\r\n\r\n").encode()
        self.host, self.port = host, port
        self.latencies: list[float] = []
        self.seqs: list[int] = []
        self.connected = asyncio.Event()

    async def run(self) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        writer.write(self.request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n", 1)[0], head
        buffer = b""
        try:
            while True:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    return
                buffer += await reader.readexactly(size)
                await reader.readexactly(2)
                now = time.time()
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    if block.startswith(b":"):
                        self.connected.set()
                        continue
                    fields = dict(line.split(": ", 1) for line in block.decode().split("\n"))
                    data = json.loads(fields["data"])
                    self.seqs.append(int(fields["id"]))
                    self.latencies.append(now - _epoch(data["ts"]))
                    if fields["event"] in ("run_finished", "run_failed", "run_cancelled"):
                        return
        finally:
            writer.close()


async def bench(subscribers: int, chunks: int) -> None:
    fake_port = free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "orchestra.engine.llm.fake_server", "--port", str(fake_port), "--mode", "echo",
         "--delay", "0.06"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        with orchestra_server() as (base, proc, env):
            orchestra_cli(env, "user", "create", "admin", "--role", "ADMINISTRATOR", "--password-stdin",
                          input="password-123\n")
            async with httpx.AsyncClient(base_url=base + "/api/v1", timeout=30) as http:
                token = (await http.post("/auth/login", json={"user_name": "admin", "password": "password-123"})
                         ).json()["access_token"]
                http.headers["Authorization"] = f"Bearer {token}"
                provider = await http.post("/provider", json={
                    "name": "fake", "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
                    "base_url": f"http://127.0.0.1:{fake_port}/v1"})
                worker = await http.post("/agent/worker", json={"name": "w", "provider_id": provider.json()["provider_id"]})
                text = "x " * min(chunks // 2, 97)  # the fake echoes at most 200 characters
                # Echo mode repeats the prompt word by word; two echo steps run concurrently.
                wid = worker.json()["worker_id"]
                steps = [{"id": "h", "agent": {"human": True}, "prompt": "Text?"}] + [
                    {"id": f"echo{i}", "agent": {"worker": wid}, "prompt": "{{steps.h.output}}",
                     "depends_on": ["h"]} for i in (1, 2)]
                tid = (await http.post("/workflow/template", json={"name": "sse", "steps": steps})).json()["template_id"]
                trace_id = (await http.post("/workflow/run", json={"template_id": tid})).json()["trace_id"]
                await asyncio.sleep(0.5)
                host, port = base.split("//")[1].split(":")
                rss_before = rss_bytes(proc.pid)
                subs = [Subscriber(host, int(port), f"/api/v1/workflow/sse/{trace_id}", token)
                        for _ in range(subscribers)]
                tasks = []
                for i in range(0, subscribers, 100):  # connect in batches (listen backlog)
                    batch = subs[i:i + 100]
                    tasks += [asyncio.create_task(s.run()) for s in batch]
                    await asyncio.wait_for(asyncio.gather(*(s.connected.wait() for s in batch)), 60)
                await asyncio.sleep(1.0)
                rss_after = rss_bytes(proc.pid)
                began = time.perf_counter()
                # The fake sends each word 60 ms apart: one coalesced token event each.
                await http.post(f"/workflow/reply/{trace_id}", json={"content": text})
                await asyncio.wait_for(asyncio.gather(*tasks), 300)
                elapsed = time.perf_counter() - began
        counts = {len(s.seqs) for s in subs}
        contiguous = all(s.seqs == list(range(1, len(s.seqs) + 1)) for s in subs)
        live = [lat for s in subs for lat, seq in zip(s.latencies, s.seqs) if seq > 4]
        report("subscribers", subscribers, "")
        report("events per subscriber", max(counts), "", None)
        report("every subscriber got every event once, in order", float(contiguous and len(counts) == 1), "bool")
        report("delivery latency p50", median(live) * 1000, "ms")
        report("delivery latency p99", percentile(live, 99) * 1000, "ms", "< 100 ms")
        report("server memory per subscriber", (rss_after - rss_before) / subscribers / 1024, "KiB", "< 50 KiB")
        report("run wall time after the reply", elapsed, "s")
    finally:
        fake.terminate()
        fake.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--chunks", type=int, default=195)
    args = parser.parse_args()
    asyncio.run(asyncio.wait_for(bench(args.subscribers, args.chunks), timeout=600))


if __name__ == "__main__":
    main()
