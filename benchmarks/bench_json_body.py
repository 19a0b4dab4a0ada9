"""The strict JSON body parser against hostile shapes: how long a megabyte takes.

The parser checks depth, duplicate keys, NaN and number lengths before or while it
decodes; the goal is that no body of the allowed size makes it run long (linear, never
quadratic), so a client cannot buy seconds of CPU with one request. Figures: ms per
shape, and the ratio to the standard library's `json.loads` of the same bytes where that
succeeds. Goal: every shape of ~1 MB under 2 s on a small machine (tests/web/test_json_body.py
checks what each shape gives; the time is measured here, not asserted in a unit test).

    python benchmarks/bench_json_body.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import median, report  # noqa: E402
from orchestra.json_body import JSONBodyError, parse  # noqa: E402


def shapes() -> dict[str, bytes]:
    return {
        "wide (70,000 small arrays)": b"[" + b",".join(b'[1,{"a":"b"}]' for _ in range(70_000)) + b"]",
        "deep (500,000 nested arrays)": b"[" * 500_000 + b"]" * 500_000,
        "unbalanced (1,000,000 open brackets)": b"[" * 1_000_000,
        "many keys (50,000 in one object)": ("{" + ",".join(f'"k{i}": {i}' for i in range(50_000)) + "}").encode(),
    }


def timed(fn, raw: bytes) -> float:
    started = time.perf_counter()
    try:
        fn(raw)
    except (JSONBodyError, ValueError, RecursionError):
        pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for name, raw in shapes().items():
        ours = median([timed(parse, raw) for _ in range(args.rounds)])
        report(f"{name}, {len(raw) / 1e6:.1f} MB", ours * 1000, "ms", "< 2000 ms")
        try:
            json.loads(raw)
        except (ValueError, RecursionError):
            continue
        stdlib = median([timed(json.loads, raw) for _ in range(args.rounds)])
        report("  ratio to json.loads", ours / stdlib, "x")


if __name__ == "__main__":
    main()
