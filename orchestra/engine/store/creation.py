"""Where runs are created: the one statement in orchestra that inserts `workflow_run` rows.

Every start goes through `create_runs` (reached as `RunStore.create`): `POST /workflow/run`,
a webhook, an MCP tool call (all three `services/runs.start_run`), a retry
(`runs.retry_run`), a fork (`services/forks.py`), a schedule's fires
(`services/schedule_fires.py`) and a child run (`store/children.py`). A caller describes
each run as a `NewRun`, with every column it sets; `create_runs` writes every column of
every row (the same defaults whoever starts it), the run's step rows after it, inside the
caller's transaction (its start key, its schedule fire, its parent's events commit with
it). `tests/test_run_creation.py` keeps it the only insert.

The claim rule: a run the caller's process hands to its engine at once after the commit
is stored claimed when the engine has room (`claim`: `Engine.claim_now`), then
`Engine.begin` adopts it (no claim round), else it is stored `queued` and submitted. A
burst (a schedule look's runs) is stored queued and taken by `Engine.submit_many`, which
claims and starts them together in one transaction.

The budget rules (SPEC §12, §14, §15b), in pico-dollars, None for none: a started run's
is the smaller of its template's `limits.budget_usd` and the `budget_usd` it was started
with (`start_budget`); a retry or a fork carries its source's whole budget (`carried_budget`);
a child run has its own template's limit (`child_budget`), and every budget above it in
its chain bounds it too (store/ledger.py: a reservation fits only under all of them), so
it spends at most what its parent's run tree allows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestra.db.models import RunStep, WorkflowRun, new_id, utcnow
from orchestra.money.amounts import parse_usd, read_usd, to_pico
from orchestra.vocabulary import RunStatus, StepStatus

CHUNK = 500  # rows in one INSERT

#: A step row's columns a caller may leave out, and what they are then.
_STEP_DEFAULTS: dict[str, Any] = {
    "path": "", "attempt": 1, "reused": False, "output": None, "output_value": None, "error": None,
    "usage": None, "reuse_key": None, "started_at": None, "finished_at": None,
}


@dataclass(frozen=True)
class NewRun:
    """A run about to be stored: what its starter decides. `step_rows`: the run's step
    rows (each without `run`), default one `pending` row per top-level step."""

    owner_id: str
    template_id: str | None
    template_name: str
    steps: list[dict[str, Any]]
    spec: dict[str, Any] | None
    template_version: int | None = None
    input_text: str = ""
    input_value: Any = None
    files: list[dict[str, Any]] = field(default_factory=list)
    budget_pusd: int | None = None
    trace_parent: str | None = None
    trigger: dict[str, Any] | None = None  # what started it (SPEC §11)
    retry_of: str | None = None
    forked_from: dict[str, Any] | None = None
    parent_trace_id: str | None = None  # a child run (SPEC §14)
    parent_path: str | None = None
    depth: int = 1
    workspace_id: str | None = None  # its template's workspace (SPEC §16)
    trace_id: str = field(default_factory=new_id)
    step_rows: list[dict[str, Any]] | None = None

    def columns(self, claim: dict[str, Any], now: Any) -> dict[str, Any]:
        """Every column of the run's row."""
        return {
            "trace_id": self.trace_id, "owner": self.owner_id, "template": self.template_id,
            "template_name": self.template_name, "template_version": self.template_version,
            "steps": self.steps, "spec": self.spec, "input": self.input_text,
            "input_value": self.input_value, "files": list(self.files or []),
            "retry_of": self.retry_of, "forked_from": self.forked_from,
            "status": RunStatus.QUEUED, "error": None, "created_at": now,
            "started_at": None, "finished_at": None,
            "owner_process": None, "lease_until": None, "attempts": 0, "cancel_requested": False,
            "trace_parent": self.trace_parent, "budget_pusd": self.budget_pusd, "spent_pusd": None,
            "parent_trace_id": self.parent_trace_id, "parent_path": self.parent_path,
            "depth": self.depth, "trigger": self.trigger, "workspace_id": self.workspace_id,
            **claim,
        }

    def step_columns(self) -> list[dict[str, Any]]:
        rows = self.step_rows
        if rows is None:
            rows = [{"step_id": step["id"], "path": step["id"], "status": StepStatus.PENDING}
                    for step in self.steps or []]
        return [{**_STEP_DEFAULTS, **row, "run": self.trace_id} for row in rows]


async def create_runs(db: Any, runs: Sequence[NewRun], *,
                      claim: Callable[[str], dict[str, Any]] | None = None) -> list[WorkflowRun]:
    """Store `runs` (`queued`) and their step rows, in the caller's transaction; the rows
    as stored (nothing read back). `claim`: the engine's `claim_now` (of the run's owner), for
    the one run a caller hands to its engine at once (claimed when there is room: `Engine.begin`)."""
    if claim is not None and len(runs) != 1:
        raise ValueError("a claim is for one run its caller starts at once; a burst is stored queued")
    now = utcnow()
    columns = [run.columns(claim(run.owner_id) if claim is not None else {}, now) for run in runs]
    steps = [row for run in runs for row in run.step_columns()]
    if steps:  # insert_many takes its columns from the first row: give every row all of them
        keys = list(dict.fromkeys(key for row in steps for key in row))
        steps = [{key: row.get(key) for key in keys} for row in steps]
    for at in range(0, len(columns), CHUNK):
        await db.aexecute(WorkflowRun.insert_many(columns[at:at + CHUNK]))
    for at in range(0, len(steps), CHUNK):
        await db.aexecute(RunStep.insert_many(steps[at:at + CHUNK]))
    return [WorkflowRun(**row) for row in columns]


# --- budgets ------------------------------------------------------------------------------


def template_budget(spec: dict[str, Any] | None) -> int | None:
    """A template's `limits.budget_usd` in pico-dollars (rounded down), None: none."""
    amount = read_usd(((spec or {}).get("limits") or {}).get("budget_usd"))
    return None if amount is None else to_pico(amount, up=False)


def start_budget(spec: dict[str, Any] | None, budget_usd: Any) -> int | None:
    """The budget a started run has: the smaller of its template's limit and the
    `budget_usd` it was started with; 422 naming budget_usd when that is negative or not
    a number."""
    given = None if budget_usd is None else parse_usd(budget_usd, "budget_usd")
    amounts = [a for a in (given, read_usd(((spec or {}).get("limits") or {}).get("budget_usd")))
               if a is not None]
    return to_pico(min(amounts), up=False) if amounts else None


def carried_budget(source: WorkflowRun, spec: dict[str, Any] | None) -> int | None:
    """The budget of a retry or a fork of `source` (SPEC §15b): the source's whole budget
    (its top-ups included; the new run's ledger starts at zero and reuses what the source
    paid for), or the `limits.budget_usd` of `spec` when that is smaller (a fork onto
    another version: that version's template); None: neither has one."""
    amounts = [a for a in (source.budget_pusd, template_budget(spec)) if a is not None]
    return min(amounts) if amounts else None


def child_budget(spec: dict[str, Any] | None) -> int | None:
    """A child run's own budget: its template's limit. The budgets above it in its chain
    bound it as well (store/ledger.py), so it is never given a share of them here."""
    return template_budget(spec)
