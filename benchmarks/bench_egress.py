"""What the egress rule costs a provider call: the OpenAI-compatible client's CPU per
streamed call, through httpx2's own transport (what the client used before the rule)
and through the egress transport (resolve, check, connect to the checked address), in
the same process, rounds alternating, against the zero-latency fake model in its own
process.

Two shapes: `pooled` (one client, `--concurrency` calls at a time: connections are
reused, so the rule runs once per new connection) and `fresh` (a new client per call:
every call makes a new connection, the rule's worst case).

    python benchmarks/bench_egress.py [--calls 400] [--concurrency 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2  # noqa: E402

from benchmarks.bench_engine import fake_provider  # noqa: E402
from benchmarks.common import median  # noqa: E402
from orchestra.egress import EgressPolicy  # noqa: E402
from orchestra.engine.llm.base import ChatMessage, collect  # noqa: E402
from orchestra.engine.llm.openai_compat import OpenAICompatClient  # noqa: E402
from orchestra.tls import client_tls  # noqa: E402

HELLO = [ChatMessage("user", "say something of about forty tokens, please, for the benchmark")]
LOOPBACK = EgressPolicy.parse("127.0.0.1")


def client(base_url: str, egress: bool) -> OpenAICompatClient:
    made = OpenAICompatClient(kind="openai_compatible", api_key="k", base_url=base_url, egress=LOOPBACK)
    if not egress:  # the transport the client had before the rule
        made._client._transport = httpx2.AsyncHTTPTransport(
            verify=client_tls(), limits=httpx2.Limits(max_connections=1000, max_keepalive_connections=100))
    return made


async def pooled(base_url: str, egress: bool, calls: int, concurrency: int) -> float:
    """CPU ms per call, one client, `concurrency` calls at a time."""
    c = client(base_url, egress)
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await collect(c.stream_chat(model="fake-model", messages=HELLO, tools=[]))

    await asyncio.gather(*(one() for _ in range(concurrency)))  # warm the pool
    began = time.process_time()
    await asyncio.gather(*(one() for _ in range(calls)))
    spent = time.process_time() - began
    await c.aclose()
    return spent * 1000 / calls


async def fresh(base_url: str, egress: bool, calls: int) -> float:
    """CPU ms per call, a new client (so a new connection) for every call."""
    began = time.process_time()
    for _ in range(calls):
        c = client(base_url, egress)
        await collect(c.stream_chat(model="fake-model", messages=HELLO, tools=[]))
        await c.aclose()
    return (time.process_time() - began) * 1000 / calls


async def main(calls: int, concurrency: int, rounds: int) -> None:
    with fake_provider() as base_url:
        figures: dict[str, list[float]] = {}
        for round_ in range(rounds):
            for egress in ((False, True) if round_ % 2 == 0 else (True, False)):  # order alternates
                name = "egress" if egress else "plain"
                figures.setdefault(f"pooled {name}", []).append(await pooled(base_url, egress, calls, concurrency))
                figures.setdefault(f"fresh {name}", []).append(await fresh(base_url, egress, calls // 4))
        for shape in ("pooled", "fresh"):
            plain, ruled = median(figures[f"{shape} plain"]), median(figures[f"{shape} egress"])
            print(f"{shape:6}: {plain:.3f} ms CPU per call plain, {ruled:.3f} with the egress rule "
                  f"(ratio {ruled / plain:.3f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.concurrency, args.rounds))
