"""The engine as parts: loose ends fixed when it stopped being one class of mixins
(issue 24). Each test here failed on the engine as it was."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from orchestra.core import Core
from orchestra.db.models import WorkflowRun
from orchestra.engine.model import At, StepDef, StepKind, step_defs
from orchestra.engine.store import PostgresRunStore, RunStore
from orchestra.engine.store import events as events_module
from orchestra.engine.store.events import EventLog, StoreContention
from orchestra.services import auth, runs
from tests.engine.test_engine import events, kinds, setup_agent, start, wait_status

ENGINE = Path(__file__).resolve().parents[2] / "orchestra" / "engine"
HUMAN = [{"id": "h", "agent": {"human": True}, "prompt": "Your name?"}]


async def waiting(core, fake) -> str:
    who = await setup_agent(core, fake)
    trace_id = await start(core, who, HUMAN)
    await wait_status(core, trace_id, "waiting_reply")
    return trace_id


async def test_a_cancel_of_a_run_nobody_holds_keeps_its_reason(core):
    """A queued run nobody claimed yet is claimed by the cancel and launched already
    cancelled: its `run_cancelled` says the reason the cancel gave (it said the default)."""
    alice = await auth.register(core, user_name="alice", password="password-123")
    run = await WorkflowRun.acreate(owner=alice.id, template_name="t", steps=HUMAN, status="queued")
    await core.engine.cancel(run.trace_id, reason="The run's user was deleted.")
    stored = await wait_status(core, run.trace_id, "cancelled")
    evs = await events(core, run.trace_id)
    assert kinds(evs) == ["run_cancelled"]
    assert evs[-1].data["reason"] == "The run's user was deleted."
    assert stored.owner_process is None


async def test_stop_runs_once_however_often_it_is_called(core):
    """The server's stop and then the Core's close both stop the engine: the second call
    waits for the first and does nothing again (it sent a second `wake:` to every process)."""
    await core.engine.start()
    sent: list[str] = []
    core.signals.on("control", sent.append)
    await asyncio.gather(core.engine.stop(grace=0), core.engine.stop(grace=0))
    await core.engine.stop(grace=0)
    assert sent.count("wake:") == 1


async def test_reply_checks_started_by_signals_are_kept_and_stopped(core, fake_llm):  # noqa: F811
    """A `reply` signal's check runs as a task the engine keeps a reference to (the loop
    keeps only weak ones), and a stop cancels the ones still running."""
    trace_id = await waiting(core, fake_llm)
    claims = core.engine.claims
    claims.on_control(f"reply:{trace_id}")
    claims.on_resync()
    assert claims.background() == 2
    await core.engine.stop(grace=0)
    assert claims.background() == 0
    pending = [t for t in asyncio.all_tasks() if "check_replies" in repr(t.get_coro())]
    assert pending == []


async def test_a_run_detail_needs_no_engine(core, fake_llm):  # noqa: F811
    """Reading a run (its last seq, its open questions) and its events builds no engine."""
    trace_id = await waiting(core, fake_llm)
    reader = await Core.open(core.settings, migrate_schema=False)
    try:
        run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
        detail = await runs.run_detail(reader, run)
        page, _ = await runs.list_events(reader, user_id=run.owner_id, is_admin=False, trace_id=trace_id)
        assert detail["last_seq"] == page[-1].seq >= 3
        assert [q["prompt"] for q in detail["pending_replies"]] == ["Your name?"]
        assert reader.built_engine() is None
    finally:
        await reader.close()


async def test_the_run_store_is_the_dialect_of_the_database(core):
    store = core.engine.store
    assert isinstance(store, PostgresRunStore) == core.is_postgres
    assert isinstance(store, RunStore)


async def test_a_row_and_event_write_gives_up_on_endless_seq_conflicts(core, monkeypatch):
    """`RunStore.write` and `EventLog.append_many` share one retry policy for seq
    conflicts, with a deadline (the store's write retried every 5 ms forever)."""
    monkeypatch.setattr(events_module, "APPEND_DEADLINE_SECONDS", 0.2)
    alice = await auth.register(core, user_name="alice", password="password-123")
    run = await WorkflowRun.acreate(owner=alice.id, template_name="t", steps=HUMAN, status="running")
    await EventLog(core.db).append(run.trace_id, "run_started")
    store = core.engine.store

    async def always_seq_one() -> list:
        return await store.events.insert(run.trace_id, [("token", {"text": "x"}, None)], last=0)

    with pytest.raises(StoreContention):
        await asyncio.wait_for(store.write(run.trace_id, always_seq_one, fenced=False), 10)


def test_steps_are_typed_once_with_one_set_of_defaults():
    steps = step_defs([
        {"id": "a", "agent": {"worker": "w1"}, "prompt": "p"},
        {"id": "m", "foreach": {"items": "[1]"}, "agent": {"human": True}, "prompt": "q",
         "depends_on": ["a"], "retry": {"max_attempts": 2}, "on_error": "continue"},
        {"id": "l", "loop": {"steps": [{"id": "x", "agent": {"node": "planner"}, "prompt": "p"}],
                             "until": "true", "max_iterations": 3}},
    ])
    a, m, loop = steps
    assert isinstance(a, StepDef) and a.kind is StepKind.CALL and a.depends_on == ()
    assert a.max_attempts == 1 and not a.continue_on_error and not a.has_default
    assert m.kind is StepKind.FOREACH and m.foreach.max_concurrency == 4 and m.human
    assert m.max_attempts == 2 and m.continue_on_error and m.depends_on == ("a",)
    assert loop.kind is StepKind.LOOP and loop.loop.steps[0].agent.as_json() == {"node": "planner"}
    with pytest.raises(AttributeError):
        a.id = "b"  # frozen
    item = At("m", "m[3]")
    assert (str(item), item.path, At.top("a").path) == ("m", "m[3]", "a")


def _imports(path: Path) -> set[str]:
    """Every orchestra module `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("orchestra"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("orchestra"))
    return found


def test_the_engine_has_no_import_circle_and_no_long_module():
    """No engine module imports one that imports it back (live.py and questions.py did,
    through a TYPE_CHECKING import), and none is over 600 lines."""
    root = ENGINE.parent.parent
    modules = {}
    for path in ENGINE.rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
        assert len(path.read_text().splitlines()) <= 600, path
    graph = {name: {m for m in _imports(path) if m in modules and m != name}
             for name, path in modules.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            here = todo.pop()
            if here == goal:
                return True
            if here not in seen:
                seen.add(here)
                todo.extend(graph[here])
        return False

    circles = sorted((a, b) for a in graph for b in graph[a]
                     if not a.startswith(b + ".") and reaches(b, a) and a < b)
    assert circles == []


def test_the_output_bound_counts_utf8_bytes_not_characters():
    """ORCHESTRA_STEP_OUTPUT_MAX_BYTES is checked in UTF-8 bytes: five `é` are 5
    characters but 10 bytes (12 as a JSON string), past a 10-byte limit."""
    from orchestra.engine.live import StepFailure
    from orchestra.engine.sizes import check_output, utf8_size

    assert utf8_size("é" * 5) == 10
    check_output("e" * 8, limit=10, of="step 'a'")  # 10 bytes with its quotes: fits
    with pytest.raises(StepFailure, match="reached 12 bytes"):
        check_output("é" * 5, limit=10, of="step 'a'")


async def test_a_run_whose_stored_steps_cannot_be_read_fails_and_says_why(core):
    """Steps an older, looser release stored and the language no longer reads: the run
    fails with a readable error (the claim loop goes on with other runs)."""
    alice = await auth.register(core, user_name="alice", password="password-123")
    run = await WorkflowRun.acreate(owner=alice.id, template_name="t", status="queued",
                                    steps=[{"id": "a", "agent": {"cat": "tom"}, "prompt": "p"}])
    await core.engine.submit(run.trace_id)
    stored = await wait_status(core, run.trace_id, "failed")
    assert stored.error.startswith("The run's steps cannot be read")
    assert kinds(await events(core, run.trace_id)) == ["run_failed"]
