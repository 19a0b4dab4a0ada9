"""Template versions at scale (SPEC §13): list and diff with 1,000 versions of a 50-step
template, against the same with 10 versions.

Every version is made by the real save path (`update_template`: validation, the
version number under the template's lock, the version row), on a fresh SQLite store
(or `--database-url postgresql://…`, a database that exists and is empty). Then the
version list and three diffs (first → last, the last two, first → second) are timed
in alternation, `--repeats` times each, medians quoted. Goal: with 1,000 versions a
list under 50 ms and a diff under 10 ms, and a diff as fast as with 10 versions
(ratio ≈ 1): a diff reads only the two versions it compares, a list reads no content.

Also the price every agent call pays for forks (engine/reuse.py): its reuse key (the
definition's digest, cached per step, the rendered prompt, the agent's fingerprint),
against rendering the same 1 KiB prompt, which every call already does. Goal: a few
microseconds, well under the render.

    python benchmarks/bench_versions.py [--versions 1000] [--steps 50] [--repeats 30]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import median, report  # noqa: E402
from orchestra.core import Core  # noqa: E402
from orchestra.engine.model import step_defs  # noqa: E402
from orchestra.engine.reuse import agent_fingerprint, call_key  # noqa: E402
from orchestra.engine.sizes import render_bounded  # noqa: E402
from orchestra.language.expressions import Scope  # noqa: E402
from orchestra.services import auth, templates, versions
from orchestra.services.agent_cache import AgentConfig  # noqa: E402
from orchestra.services.roles import Role  # noqa: E402
from orchestra.settings import Settings  # noqa: E402

SECRET = "bench-secret-" + "z" * 32


def steps_of(count: int, version: int) -> list[dict]:
    """A chain of human steps; each version edits one step's prompt."""
    return [{"id": f"s{n}", "agent": {"human": True},
             "prompt": f"step {n} of version {version if n == version % count else 0}: {{{{input}}}}",
             "depends_on": [f"s{n - 1}"] if n else []} for n in range(count)]


async def fill(core: Core, owner: str, name: str, count: int, steps: int) -> tuple[dict, float]:
    """A template saved `count` times through the real save path; (ids, seconds per save)."""
    template = await templates.create_template(core, owner_id=owner, is_admin=False, name=name,
                                               steps=steps_of(steps, 1))
    started = time.perf_counter()
    for version in range(2, count + 1):
        await templates.update_template(core, user_id=owner, is_admin=False, template_id=template.id,
                                        name=name, steps=steps_of(steps, version))
    return ({"user_id": owner, "is_admin": False, "template_id": template.id},
            (time.perf_counter() - started) / max(1, count - 1))


def operations(core: Core, who: dict, count: int) -> dict:
    async def listing():
        assert len(await versions.list_versions(core, **who)) == count

    def diff(a: int, b: int):
        return lambda: versions.diff_versions(core, from_version=a, to_version=b, **who)

    return {"list": listing, "diff first→last": diff(1, count), "diff last two": diff(count - 1, count),
            "diff first two": diff(1, 2)}


async def measure(core: Core, owner: str, count: int, steps: int, repeats: int) -> dict[str, tuple[float, float]]:
    """{operation: (median with 10 versions, median with `count`)}, the two alternated."""
    small, save_small = await fill(core, owner, "small", 10, steps)
    large, save_large = await fill(core, owner, "large", count, steps)
    ops = (operations(core, small, 10), operations(core, large, count))
    times: dict[str, tuple[list[float], list[float]]] = {key: ([], []) for key in ops[0]}
    for _ in range(repeats):
        for key in times:
            for side in (0, 1):
                started = time.perf_counter()
                await ops[side][key]()
                times[key][side].append(time.perf_counter() - started)
    return {"save": (save_small, save_large),
            **{key: (median(a), median(b)) for key, (a, b) in times.items()}}


async def key_cost(repeats: int, calls: int = 2000) -> tuple[float, float]:
    """(µs per reuse key, µs per render) of one agent call's 1 KiB prompt, medians."""
    step = step_defs([{"id": "write", "agent": {"worker": "w"}, "output_schema": {"type": "object"},
                       "prompt": "Write about {{ input.topic }} after {{ steps.plan.output }}. " + "x" * 900}])[0]
    scope = Scope({"input": {"topic": "forks"}, "steps": {"plan": {"output": "a plan " * 10, "status": "succeeded"}}})
    prompt = await render_bounded(step.prompt, scope, limit=1 << 20, where="write")
    agent = agent_fingerprint(AgentConfig(
        kind="worker", id="w", owner_id="o", name="w", system_prompt="Be brief." * 20, skill_instructions=None,
        tools=("calculator",), provider_id="p", provider_kind="openai_compatible",
        provider_base_url="http://127.0.0.1:1/v1", provider_api_key="k", model="m"))
    keys, renders = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call_key(step, prompt, [], agent)
        keys.append((time.perf_counter() - started) / calls)
        started = time.perf_counter()
        for _ in range(calls // 10):
            await render_bounded(step.prompt, scope, limit=1 << 20, where="write")
        renders.append((time.perf_counter() - started) / (calls // 10))
    return median(keys) * 1e6, median(renders) * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{tmp}/store/orchestra.db"
        Path(tmp, "store").mkdir()
        settings = Settings.from_env(env={}, home=Path(tmp) / "home", database_url=url, secret_key=SECRET,
                                     argon2_time_cost=1, argon2_memory_cost=1024, argon2_parallelism=1)
        core = await Core.open(settings)
        try:
            owner = (await auth.register(core, user_name="bench", password="bench-password-1", role=Role.USER)).id
            figures = await measure(core, owner, args.versions, args.steps, args.repeats)
        finally:
            await core.close()
    print(f"store: {url.split(':', 1)[0]}; {args.steps}-step template; medians of {args.repeats}")
    for key, (small, large) in figures.items():
        goal = {"list": "< 50 ms", "save": None}.get(key, "< 10 ms")
        report(f"{key} ({args.versions} versions)", large * 1000, "ms", goal)
        report(f"{key} ({args.versions} versions) / (10 versions)", large / small, "x",
               "≈ 1" if key.startswith("diff") or key == "save" else None)
    key_us, render_us = await key_cost(args.repeats)
    report("reuse key of one call", key_us, "µs", "a few µs")
    report("reuse key / render of its 1 KiB prompt", key_us / render_us, "x", "< 1")


if __name__ == "__main__":
    asyncio.run(main())
