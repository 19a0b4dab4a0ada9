"""Code steps (SPEC §17): one attempt runs the step's source in the code sandbox
(code_sandbox.py) on the step's variables, with the clock frozen at the instance's
stored start, and gives the value of its last expression as the step's output.

The clock: an instance's first attempt stores its `started_at` (the row), and every
attempt sees that instant as `datetime.now()` — a retry here through `LiveRun`'s
memory, a run resumed elsewhere by reading the stored rows once, so a resumed run
computes the same value. Everything else (attempts, `retry`, `timeout_seconds`, the
events, `on_error`, `output_schema`, `foreach`) is any call's (calls.py, containers.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from orchestra.db.models import utcnow
from orchestra.engine.code_sandbox import CodeBounds, CodeError, CodeSandbox
from orchestra.engine.live import LiveRun, StepFailure
from orchestra.engine.model import At, StepDef
from orchestra.engine.store import RunStore
from orchestra.language import schemas
from orchestra.language.expressions import Scope

VARIABLES = ("input", "steps", "item", "index", "loop")  # what a code step may read


class CodeSteps:
    """Engine part: the code sandbox's pool, and one attempt of a `code` step."""

    def __init__(self, settings: Any, *, store: RunStore, sandbox: Any) -> None:
        self.store = store
        self.schema_sandbox = sandbox  # the expressions' sandbox: a large output_schema check
        self.sandbox = CodeSandbox(CodeBounds.from_settings(settings))

    async def close(self) -> None:
        await self.sandbox.close()

    async def clock(self, live: LiveRun, at: At) -> dt.datetime:
        """The instance's start (naive UTC, as rows store it): what its code sees as now."""
        clocks = live.code_clocks
        if at.path not in clocks and live.resumed and not live.code_clocks_read:
            live.code_clocks_read = True
            for row in await self.store.step_rows(live.trace_id):
                if row.started_at is not None and row.path not in clocks:
                    clocks[row.path] = row.started_at
            await self.store.release()
        return clocks.setdefault(at.path, utcnow())

    async def attempt(self, live: LiveRun, step: StepDef, at: At, scope: Scope) -> Any:
        """One attempt: the code's JSON output, or StepFailure with the code's error."""
        now = await self.clock(live, at)
        variables = {name: scope.variables[name] for name in VARIABLES if name in scope.variables}
        await self.store.release()  # no pooled connection held while the code runs (or waits its turn)
        try:
            output = await self.sandbox.run(step.code["source"], variables, now.replace(tzinfo=dt.UTC),
                                            step.timeout_seconds)
        except CodeError as exc:
            raise StepFailure(exc.message) from None
        if step.output_schema is not None:
            found = await schemas.check(output, step.output_schema, root="output", sandbox=self.schema_sandbox)
            if found:
                raise StepFailure(f"The output did not match output_schema: {schemas.describe(found)}")
        return output
