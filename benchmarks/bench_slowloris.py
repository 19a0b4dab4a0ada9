"""Slowloris against a real `orchestra serve`: N clients trickle request heads one byte a
second while one ordinary client keeps asking; how long the tricklers live, how fast the
ordinary client is served, and the server's open descriptors before, at peak and after.

Loopback only, bounded (`--clients`, default 1000; everything stops by itself within
deadline + 20 s). Run from the project root: `python benchmarks/bench_slowloris.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import httpx

from common import orchestra_server, percentile, report


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def trickle(port: int, lifetimes: list[float], give_up: float) -> None:
    """Send a head one byte a second until the server closes the connection."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    started = time.monotonic()
    head = b"GET /api/v1/auth/list HTTP/1.1\r\nHost: slow\r\nX-Slow: " + b"a" * 1000
    try:
        for byte in head:
            if time.monotonic() - started > give_up:
                return
            writer.write(bytes([byte]))
            try:
                if await asyncio.wait_for(reader.read(65536), timeout=1.0) == b"":
                    break
                await reader.read()  # the 408; then the server closes
                break
            except asyncio.TimeoutError:
                continue
    except OSError:
        pass
    finally:
        lifetimes.append(time.monotonic() - started)
        writer.close()


async def ordinary(base: str, stop: asyncio.Event, latencies: list[float], statuses: list[int]) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        while not stop.is_set():
            started = time.monotonic()
            answer = await client.get("/api/v1/auth/list")
            latencies.append(time.monotonic() - started)
            statuses.append(answer.status_code)
            await asyncio.sleep(0.2)


async def attack(base: str, port: int, pid: int, clients: int, deadline: float) -> None:
    before = open_descriptors(pid)
    lifetimes: list[float] = []
    latencies: list[float] = []
    statuses: list[int] = []
    stop = asyncio.Event()
    served = asyncio.create_task(ordinary(base, stop, latencies, statuses))
    tasks = [asyncio.create_task(trickle(port, lifetimes, deadline + 20)) for _ in range(clients)]
    peak = before
    while not all(t.done() for t in tasks):
        peak = max(peak, open_descriptors(pid))
        await asyncio.sleep(0.25)
    stop.set()
    await served
    await asyncio.sleep(1)
    report("tricklers", clients, "clients")
    report("trickler lifetime p50", percentile(lifetimes, 50), "s")
    report("trickler lifetime max", max(lifetimes), "s", f"<= {deadline + 2:g}")
    report("ordinary request p50", percentile(latencies, 50) * 1000, "ms")
    report("ordinary request max", max(latencies) * 1000, "ms", "< 1000")
    report("ordinary requests not 401", sum(s != 401 for s in statuses), "requests", "0")
    report("server descriptors before", before, "fds")
    report("server descriptors peak", peak, "fds")
    report("server descriptors after", open_descriptors(pid), "fds", f"~{before}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--header-timeout", type=float, default=10.0)
    args = parser.parse_args()
    env = {"ORCHESTRA_HEADER_TIMEOUT": str(args.header_timeout)}
    with orchestra_server(env) as (base, proc, _):
        port = int(base.rsplit(":", 1)[1])
        asyncio.run(attack(base, port, proc.pid, args.clients, args.header_timeout))


if __name__ == "__main__":
    main()
