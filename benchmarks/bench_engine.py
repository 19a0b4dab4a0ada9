"""Engine overhead per step, with a zero-latency fake provider.

A template of N sequential worker steps runs in process on a temp SQLite store. The
engine's provider client is wrapped so the time spent inside `stream_chat` (the
provider's share, HTTP included) is summed for the very same run. Overhead per step =
(run wall time − provider time) / N: status updates, stored events, prompt rendering,
scheduling. A run's store writes go through its ordered writer task, so those that
overlap a provider call are hidden; the writes still pending when the last step ends
are counted (the run ends only once they are stored). Goal: under 5 ms.

    python benchmarks/bench_engine.py [--steps 50] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import free_port, median, report  # noqa: E402
from orchestra.core import Core  # noqa: E402
from orchestra.db.models import WorkflowRun  # noqa: E402
from orchestra.services import agents, auth, providers, runs, templates  # noqa: E402
from orchestra.settings import Settings  # noqa: E402


@contextmanager
def fake_provider() -> Iterator[str]:
    """FakeLLM (zero latency, echo) in its own process, so it does not share our GIL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestra.testing.fake_llm", "--port", str(port),
         "--zero-latency", "--mode", "echo"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class TimedClient:
    """The real provider client, timing how long each streamed call takes."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seconds = 0.0

    async def stream_chat(self, **kwargs):
        began = time.perf_counter()
        try:
            async for event in self.inner.stream_chat(**kwargs):
                self.seconds += time.perf_counter() - began
                yield event
                began = time.perf_counter()
        finally:
            self.seconds += time.perf_counter() - began

    async def aclose(self) -> None:
        await self.inner.aclose()


async def bench(steps: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="orchestra-bench-engine-") as tmp, fake_provider() as base_url:
        settings = Settings.from_env(
            env={}, home=Path(tmp), secret_key="bench-" + "k" * 40,
            argon2_time_cost=1, argon2_memory_cost=1024, argon2_parallelism=1,
            egress_allow="127.0.0.1",  # the fake provider listens on loopback
        )
        core = await Core.open(settings)
        try:
            user = await auth.register(core, user_name="bench", password="password-123")
            provider = await providers.create_provider(
                core, name="fake", kind="openai_compatible", model_id="fake-model", api_key="k",
                base_url=base_url,
            )
            worker = await agents.create_worker(core, owner_id=user.id, name="w", provider_id=provider.id)
            chain = [{"id": "s0", "agent": {"worker": worker.id}, "prompt": "{{input}}"}] + [
                {"id": f"s{i}", "agent": {"worker": worker.id}, "prompt": f"{{{{steps.s{i - 1}.output}}}}",
                 "depends_on": [f"s{i - 1}"]}
                for i in range(1, steps)
            ]
            template = await templates.create_template(core, owner_id=user.id, is_admin=False, name="chain", steps=chain)
            engine = core.engine
            config = await core.agent_cache.worker(worker.id)
            key = (config.provider_kind, config.provider_base_url, config.provider_api_key)
            timed = engine.agent_steps.clients[key] = TimedClient(engine.agent_steps.build_client(config))

            overheads, walls, providers_s, cpus = [], [], [], []
            for _ in range(repeat):
                timed.seconds = 0.0
                began, cpu_began = time.perf_counter(), time.process_time()
                run = await runs.start_run(core, user_id=user.id, is_admin=False, template_id=template.id, input="go")
                await engine.runs[run.trace_id].task
                wall = time.perf_counter() - began
                cpus.append((time.process_time() - cpu_began) / steps)
                stored = await WorkflowRun.aget(WorkflowRun.trace_id == run.trace_id)
                assert stored.status == "succeeded", stored.error
                walls.append(wall)
                providers_s.append(timed.seconds)
                overheads.append((wall - timed.seconds) / steps)
            report(f"run wall time, {steps} sequential steps", median(walls) * 1000, "ms")
            report("time inside the provider client", median(providers_s) * 1000, "ms")
            report("engine overhead per step (median of runs)", median(overheads) * 1000, "ms", "< 5 ms")
            # CPU of this process (its store threads included) per step, provider client
            # included: less at the mercy of other processes on a shared machine than wall time
            report("process CPU per step (median of runs)", median(cpus) * 1000, "ms")
        finally:
            await core.engine.stop()
            await core.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(asyncio.wait_for(bench(args.steps, args.repeat), timeout=300))


if __name__ == "__main__":
    main()
