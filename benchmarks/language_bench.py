"""The workflow language's own cost per step (SPEC §7 goal: < 0.2 ms of expression and
schema work per step). Prints figures; asserts nothing.

One "step" here is what the engine does around a structured step whose dependencies have
ended: build its scope (input + three ended steps), evaluate its `when`, render a prompt
with a v1 placeholder and two CEL expressions, and parse and validate a JSON answer
against its output_schema. The template's `output` (once per run) is timed apart. Run:

    python benchmarks/language_bench.py [--steps 20000]

Evaluation is async since expressions may run in the engine's sandbox (SPEC §15); these
have no comprehension and a small context, so they run inline, as in the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from orchestra.language import policies
from orchestra.language.expressions import compile_expression, render

SCHEMA = {"type": "object", "required": ["approved", "notes"],
          "properties": {"approved": {"type": "boolean"}, "notes": {"type": "string"},
                         "score": {"type": "integer", "minimum": 1, "maximum": 5},
                         "tags": {"type": "array", "items": {"type": "string"}}}}
STEP = {"id": "publish", "depends_on": ["review"], "when": "steps.review.output.approved == true"}
PROMPT = ("Publish {{steps.draft.output}} — reviewer notes: {{ steps.review.output.notes }}, "
          "score {{ steps.review.output.score * 20 }}%")
OUTPUT = "{'published': steps.review.output.approved, 'tags': steps.review.output.tags}"
ANSWER = json.dumps({"approved": True, "notes": "ready", "score": 4, "tags": ["tea", "news"]})


async def one_step(input_value, states) -> None:
    scope = policies.step_scope(input_value, states)
    await policies.decide(STEP, states, scope)
    await render(PROMPT, scope)
    value, violations = await policies.read_structured(ANSWER, SCHEMA)
    assert not violations


async def run_end(input_value, states) -> None:
    """Once per run, not per step: the template's `output`."""
    await policies.run_output({"output": OUTPUT}, [], states, input_value)


def main() -> None:
    asyncio.run(measure())


async def measure() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    input_value = {"topic": "tea", "audience": "everyone"}
    states = {
        "draft": {"output": "A post about tea. " * 20, "status": "succeeded"},
        "review": {"output": json.loads(ANSWER), "status": "succeeded"},
        "other": {"output": None, "status": "skipped"},
    }
    began = time.perf_counter()
    for source in (STEP["when"], OUTPUT, "steps.review.output.notes", "steps.review.output.score * 20"):
        compile_expression(source)
    compile_ms = (time.perf_counter() - began) * 1000
    for _ in range(500):  # warm caches (validators, compiled programs)
        await one_step(input_value, states)
    wall, cpu = [], []
    for _ in range(5):
        began, began_cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps // 5):
            await one_step(input_value, states)
        wall.append((time.perf_counter() - began) / (args.steps // 5) * 1000)
        cpu.append((time.process_time() - began_cpu) / (args.steps // 5) * 1000)
    load = os.getloadavg()[0]
    print(f"compile, 4 expressions once per template: {compile_ms:.3f} ms")
    print(f"expression + schema work per step (goal < 0.2 ms), {args.steps} steps, "
          f"load average {load:.1f} on {os.cpu_count()} cores:")
    print(f"  CPU time  median {statistics.median(cpu):.4f} ms, best {min(cpu):.4f} ms")
    print(f"  wall time median {statistics.median(wall):.4f} ms, best {min(wall):.4f} ms")
    began = time.process_time()
    for _ in range(2000):
        await run_end(input_value, states)
    print(f"the run's output expression, once per run: {(time.process_time() - began) / 2:.4f} ms CPU")


if __name__ == "__main__":
    main()
