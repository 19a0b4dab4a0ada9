"""Helpers shared by the benchmark scripts: a real server process, memory and percentiles.

Every benchmark talks to loopback only, is bounded in requests and seconds, and stops
by itself. Run them from the project root: `python benchmarks/bench_auth.py`.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


@contextmanager
def orchestra_server(env: dict[str, str] | None = None, *, home: Path | None = None,
                     root: Path = ROOT) -> Iterator[tuple[str, subprocess.Popen, dict]]:
    """`python -m orchestra serve` on a free port with a temp home, running the code under
    `root` (this tree by default; another checkout for a before/after comparison).
    Yields (base_url, process, environment) and stops the process afterwards."""
    with tempfile.TemporaryDirectory(prefix="orchestra-bench-") as tmp:
        home = home or Path(tmp)
        port = free_port()
        full_env = {
            **os.environ,
            "ORCHESTRA_HOME": str(home),
            "ORCHESTRA_SECRET_KEY": "bench-secret-" + "z" * 32,
            "ORCHESTRA_RATE_LIMIT_REGISTER": "1000000/minute",
            "ORCHESTRA_RATE_LIMIT_LOGIN": "1000000/minute",
            "ORCHESTRA_EGRESS_ALLOW": "127.0.0.1",  # the fake providers listen on loopback
            **(env or {}),
            "BENCH_CODE_ROOT": str(root),  # `orchestra_cli` with this environment runs the same code
        }
        log = open(home / "server.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestra", "serve", "--port", str(port)],
            env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(f"{base}/api/v1/auth/list", proc, timeout=90)  # a busy machine starts slowly
            yield base, proc, full_env
        finally:
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """Terminate a server process, killing it if it does not stop within 15 s."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def orchestra_cli(env: dict[str, str], *args: str, input: str | None = None) -> str:
    """Run an `orchestra` command against the same store; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestra", *args], env=env, input=input, cwd=env.get("BENCH_CODE_ROOT"),
        capture_output=True, text=True, timeout=120, check=True,
    )
    return done.stdout


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def percentile(values: list[float], pct: float) -> float:
    """The pct-th percentile (nearest rank) of values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(name: str, value: float, unit: str, goal: str | None = None) -> None:
    """One figure per line, in a form that is easy to read and to grep."""
    goal_text = f"   (goal {goal})" if goal else ""
    print(f"{name:<48} {value:>12.3f} {unit}{goal_text}", flush=True)
