"""How long `orchestra --help` (and a few other commands that never touch a server) take.

Each command runs ROUNDS times as a fresh process (`python -m orchestra …`, the same
entry point as the installed `orchestra` script), with ORCHESTRA_* variables removed
and a throwaway home. Prints min / median / max wall-clock seconds per command and the
interpreter's own start (`python -c pass`) for scale. Goal: `orchestra --help` median
under 0.5 s. Nothing listens, nothing is sent anywhere.
Run: `python benchmarks/bench_cli.py [--rounds N]`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

GOAL = 0.5
COMMANDS = [
    ("python -c pass", [sys.executable, "-c", "pass"]),
    ("orchestra --help", [sys.executable, "-m", "orchestra", "--help"]),
    ("orchestra -V", [sys.executable, "-m", "orchestra", "-V"]),
    ("orchestra workflow run --help", [sys.executable, "-m", "orchestra", "workflow", "run", "--help"]),
    ("completion of 'orchestra w'", [sys.executable, "-m", "orchestra"]),
]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    took = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
        env.update(ORCHESTRA_HOME=home, COLUMNS="100")
        results = {}
        for name, argv in COMMANDS:
            run_env = dict(env)
            if name.startswith("completion"):
                run_env.update(_ORCHESTRA_COMPLETE="complete_bash", COMP_WORDS="orchestra w", COMP_CWORD="1")
            timed(argv, run_env)  # warm the file cache
            results[name] = [timed(argv, run_env) for _ in range(args.rounds)]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (wall times grow with it; CPU less)")
    print(f"{'command':<32} {'min':>7} {'median':>7} {'max':>7} {'CPU med':>8}   ({args.rounds} runs each, seconds)")
    for name, runs in results.items():
        walls = [wall for wall, _ in runs]
        cpu = statistics.median(c for _, c in runs)
        print(f"{name:<32} {min(walls):7.3f} {statistics.median(walls):7.3f} {max(walls):7.3f} {cpu:8.3f}")
    median = statistics.median(wall for wall, _ in results["orchestra --help"])
    verdict = "meets" if median < GOAL else "MISSES"
    print(f"orchestra --help median {median:.3f} s: {verdict} the goal (< {GOAL} s)")
    if median >= GOAL:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
