"""Code steps in the engine (SPEC §17), on both stores: the output is the last
expression's value, computed in the pydantic-monty sandbox from `input`, `steps`, `item`
and `index`; errors name their line; the time, memory and recursion bounds fail the step
naming their setting; `open`, `__import__` and `os` reach nothing; `re` is the engine
that cannot backtrack; the clock is the instance's stored start."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from orchestra.db.models import RunEvent, RunStep
from orchestra.engine.code_sandbox import CodeBounds, CodeError, CodeSandbox
from orchestra.engine.live import LiveRun
from orchestra.engine.model import At
from orchestra.services import auth, runs, templates
from tests.engine.test_engine import wait_status


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def settings_overrides():
    return {"code_timeout_ms": 1000, "code_memory_mb": 16}  # the default time: a loaded machine


async def run_steps(core, steps: list[dict], input, *, statuses=("succeeded", "failed")):
    user = await auth.register(core, user_name=f"u{time.monotonic_ns()}", password="password-123")
    template = await templates.create_template(
        core, owner_id=user.id, is_admin=False, name=f"t{time.monotonic_ns()}", steps=steps,
        options={"input_schema": {}})
    run = await runs.start_run(core, user_id=user.id, is_admin=False, template_id=template.id, input=input)
    finished = await wait_status(core, run.trace_id, *statuses, timeout=30)
    rows = await core.db.list(RunStep.select().where(RunStep.run == run.trace_id))
    return finished, {row.path: row for row in rows}


def output_of(row):
    """A row's output: text is stored in `output`, any other JSON value in `output_value`."""
    return row.output_value if row.output_value is not None else row.output


async def test_the_output_is_the_last_expression_over_input_and_steps(core):
    run, rows = await run_steps(core, [
        {"id": "total", "code": {"source": "amounts = [r['amount'] for r in input['rows']]\nsum(amounts)"}},
        {"id": "top", "depends_on": ["total"], "code": {"source": (
            "import json, math\n"
            "ranked = sorted(input['rows'], key=lambda r: -r['score'])[:2]\n"
            "{'names': [r['name'] for r in ranked], 'total': steps['total']['output'],\n"
            " 'status': steps['total']['status'], 'root': math.sqrt(16), 'pair': (1, 2),\n"
            " 'text': json.dumps({'a': 1})}")}},
        {"id": "nothing", "depends_on": ["top"], "code": {"source": "x = 1"}},
    ], {"rows": [{"name": "a", "amount": 3, "score": 1}, {"name": "b", "amount": 4, "score": 9},
                 {"name": "c", "amount": 5, "score": 5}]})
    assert run.status == "succeeded", run.error
    assert output_of(rows["total"]) == 12
    assert output_of(rows["top"]) == {"names": ["b", "c"], "total": 12, "status": "succeeded",
                                      "root": 4.0, "pair": [1, 2], "text": '{"a": 1}'}
    assert rows["nothing"].status == "succeeded" and output_of(rows["nothing"]) is None
    finished = await core.db.list(RunEvent.select().where(
        (RunEvent.run == run.trace_id) & (RunEvent.kind == "step_finished")))
    assert all(e.data.get("usage") is None and "cost_usd" not in e.data for e in finished)


async def test_foreach_runs_the_code_once_per_item_with_item_and_index(core):
    run, rows = await run_steps(core, [
        {"id": "rows", "foreach": {"items": "input", "max_concurrency": 3},
         "code": {"source": "f'{index}:{item.upper()}'"}},
        {"id": "csv", "depends_on": ["rows"], "code": {"source": "'\\n'.join(steps['rows']['output'])"}},
    ], ["a", "b", "c", "d"])
    assert run.status == "succeeded", run.error
    assert output_of(rows["rows"]) == ["0:A", "1:B", "2:C", "3:D"]
    assert [output_of(rows[f"rows[{i}]"]) for i in range(4)] == ["0:A", "1:B", "2:C", "3:D"]
    assert output_of(rows["csv"]) == "0:A\n1:B\n2:C\n3:D"


async def test_a_runtime_error_fails_the_step_with_type_message_and_line(core):
    run, rows = await run_steps(core, [
        {"id": "bad", "code": {"source": "a = 1\nb = 2\n\n\nraise ValueError('no amount for ' + input)"}},
    ], "ticket-7")
    assert run.status == "failed"
    assert rows["bad"].status == "failed"
    assert rows["bad"].error == "ValueError: no amount for ticket-7 (line 5)"
    assert "ValueError: no amount for ticket-7 (line 5)" in run.error
    failed = await core.db.list(RunEvent.select().where(
        (RunEvent.run == run.trace_id) & (RunEvent.kind == "step_failed")))
    assert failed[0].data["error"] == "ValueError: no amount for ticket-7 (line 5)"


async def test_on_error_continue_when_and_retry_apply_to_code_steps(core):
    run, rows = await run_steps(core, [
        {"id": "flaky", "retry": {"max_attempts": 2}, "on_error": "continue",
         "code": {"source": "1 / 0"}},
        {"id": "skipped", "when": "input == 'no'", "code": {"source": "1"}},
        {"id": "after", "depends_on": ["flaky"],
         "code": {"source": "[steps['flaky']['status'], steps['flaky']['output']]"}},
    ], "yes")
    assert run.status == "succeeded", run.error
    assert rows["flaky"].status == "failed" and rows["flaky"].attempt == 2
    assert rows["flaky"].error == "ZeroDivisionError: division by zero (line 1)"
    assert rows["skipped"].status == "skipped"
    assert output_of(rows["after"]) == ["failed", None]


async def test_output_schema_checks_the_code_output(core):
    run, rows = await run_steps(core, [
        {"id": "n", "output_schema": {"type": "object", "required": ["n"]}, "code": {"source": "{'m': 1}"}},
    ], "x")
    assert run.status == "failed"
    assert rows["n"].status == "failed" and "n" in rows["n"].error


async def test_while_true_is_bounded_by_the_time_limit(core):
    began = time.monotonic()
    run, rows = await run_steps(core, [{"id": "spin", "code": {"source": "while True:\n    pass"}}], "x")
    took = time.monotonic() - began
    assert run.status == "failed"
    assert rows["spin"].error.startswith("the code ran past its time limit of 1000 ms (ORCHESTRA_CODE_TIMEOUT_MS)")
    assert took < 5


async def test_memory_and_recursion_are_bounded_naming_their_setting(core):
    run, rows = await run_steps(core, [
        {"id": "big", "on_error": "continue", "code": {"source": "x = [0] * (10 ** 9)\nlen(x)"}},
        {"id": "deep", "on_error": "continue", "code": {"source": "def f(n):\n    return f(n + 1)\nf(0)"}},
        {"id": "still", "depends_on": ["big", "deep"], "code": {"source": "'alive'"}},
    ], "x")
    assert run.status == "succeeded", run.error
    assert rows["big"].error == ("the code needed more memory than its limit of 16 MiB "
                                 "(ORCHESTRA_CODE_MEMORY_MB) (line 1)")
    assert rows["deep"].error.startswith("the code called deeper than its limit of 200 (ORCHESTRA_CODE_RECURSION_MAX)")
    assert output_of(rows["still"]) == "alive"


@pytest.mark.parametrize("source, expected", [
    ("open('/etc/passwd').read()", "PermissionError"),
    ("import os\nos.listdir('/')", "PermissionError"),
    ("import os\nos.getenv('HOME')", "not supported"),
    ("import os\nos.environ", "not supported"),
    ("__import__('os')", "NameError"),
    ("import subprocess", "ModuleNotFoundError"),
    ("().__class__.__mro__[1].__subclasses__()", "AttributeError"),
    ("eval(\"open('/etc/passwd').read()\")", "PermissionError"),
    ("exec(\"import os\\nx = os.listdir('/')\")", "PermissionError"),
])
async def test_what_reaches_for_the_host_finds_nothing_in_the_sandbox(source, expected):
    """Refused at save (tests/language/test_code_language.py), and nothing behind them
    at run time either: the sandbox itself, given a source the save check never saw."""
    sandbox = CodeSandbox(CodeBounds(timeout_ms=500))
    try:
        with pytest.raises(CodeError) as raised:
            await sandbox.run(source, {"input": "x"}, dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    finally:
        await sandbox.close()
    assert expected in raised.value.message
    assert "root:" not in raised.value.message and "/home" not in raised.value.message


async def test_re_cannot_backtrack_and_the_clock_is_the_stored_start(core):
    run, rows = await run_steps(core, [
        {"id": "words", "code": {"source": (
            "import re\nfrom re import sub\n"
            "m = re.search(r'(?P<user>\\w+)@(\\w+)', input)\n"
            "[re.findall(r'\\d+', input), re.split(r'\\s*,\\s*', 'a , b,c'), sub(r'(\\d)', r'<\\1>', 'a1b2'),\n"
            " m.group('user'), m.group(2), m.span(), re.fullmatch('a+', 'aaa') is not None]")}},
        {"id": "back", "on_error": "continue", "code": {"source": "import re\np = '(a)' + '\\\\1'\nre.search(p, 'aa')"}},
        {"id": "now", "code": {"source": "import datetime\n[datetime.datetime.now().isoformat(), str(datetime.date.today())]"}},
    ], "mail bob@example 12 and 345")
    assert run.status == "succeeded", run.error
    assert output_of(rows["words"]) == [["12", "345"], ["a", "b", "c"], "a<1>b<2>", "bob", "example",
                                        [5, 16], True]
    assert "cannot backtrack" in rows["back"].error and "(a)\\\\1" in rows["back"].error
    now, today = output_of(rows["now"])
    assert now == rows["now"].started_at.isoformat()
    assert today == rows["now"].started_at.date().isoformat()


async def test_re_compile_and_finditer_and_the_module_named_re():
    sandbox = CodeSandbox(CodeBounds())
    now = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    try:
        value = await sandbox.run(
            'import re\np = re.compile(r"(\\d+)", re.I)\n'
            '[p.findall("a1 b22"), p.pattern, p.sub("#", "x9"), p.search("zz7").group(1),\n'
            ' [m.group() for m in re.finditer("a.", "abacad")], re.escape("a.b")]', {}, now)
        with pytest.raises(CodeError) as raised:
            await sandbox.run("import re\nre.nothing", {}, now)
        with pytest.raises(CodeError) as shown:
            await sandbox.run("x = {1, 2}\nx", {}, now)
    finally:
        await sandbox.close()
    assert value == [["1", "22"], "(\\d+)", "x#", "7", ["ab", "ac", "ad"], "a\\.b"]
    assert raised.value.message == "AttributeError: module 're' has no attribute 'nothing' (line 2)"
    assert shown.value.message == "the output holds a value of type set at output, which JSON cannot hold"


async def test_a_resumed_run_reads_each_instance_clock_from_its_stored_start(core):
    """What a resumed run's code sees as now: the row's stored `started_at`, read once
    for the run (a run that was not resumed takes a new clock)."""
    run, rows = await run_steps(core, [
        {"id": "a", "code": {"source": "import datetime\ndatetime.datetime.now().isoformat()"}},
        {"id": "f", "foreach": {"items": "[1, 2]"}, "code": {"source": "item"}},
    ], "x")
    assert run.status == "succeeded", run.error
    steps = core.engine.code_steps
    resumed = LiveRun(trace_id=run.trace_id, owner_id=run.owner_id, input="x", files=[], steps=(),
                      resumed=True)
    assert await steps.clock(resumed, At.top("a")) == rows["a"].started_at
    assert await steps.clock(resumed, At("f", "f[1]")) == rows["f[1]"].started_at
    assert resumed.code_clocks_read and output_of(rows["a"]) == rows["a"].started_at.isoformat()
    fresh = LiveRun(trace_id=run.trace_id, owner_id=run.owner_id, input="x", files=[], steps=())
    assert await steps.clock(fresh, At.top("a")) > rows["a"].started_at


async def test_a_fork_reuses_an_unchanged_code_step_and_reruns_a_changed_one(core):
    """SPEC §17: a fork reuses a code step when its definition and everything it reads
    are unchanged (`step_reused`, the source's output, its clock included); a new input
    runs it again."""
    from orchestra.services import forks

    steps = [
        {"id": "x", "code": {"source": "import datetime\n[input['n'] * 2, datetime.datetime.now().isoformat()]"}},
        {"id": "y", "depends_on": ["x"], "code": {"source": "steps['x']['output'][0] + 1"}},
    ]
    run, rows = await run_steps(core, steps, {"n": 1})
    assert run.status == "succeeded", run.error and output_of(rows["y"]) == 3
    same = await forks.fork_run(core, user_id=run.owner_id, is_admin=False, trace_id=run.trace_id, from_step="y")
    again = await forks.fork_run(core, user_id=run.owner_id, is_admin=False, trace_id=run.trace_id,
                                 input={"n": 5})
    for fork in (same, again):
        assert (await wait_status(core, fork.trace_id, "succeeded", "failed", timeout=30)).status == "succeeded"
    kinds = {}
    for fork in (same, again):
        evs = await core.db.list(RunEvent.select().where(RunEvent.run == fork.trace_id).order_by(RunEvent.seq))
        kinds[fork.trace_id] = [(e.kind, e.data.get("step_id")) for e in evs]
        fork_rows = {r.path: r for r in await core.db.list(RunStep.select().where(RunStep.run == fork.trace_id))}
        kinds[fork.trace_id + "rows"] = fork_rows
    same_rows, again_rows = kinds[same.trace_id + "rows"], kinds[again.trace_id + "rows"]
    assert ("step_reused", "x") in kinds[same.trace_id] and ("step_started", "x") not in kinds[same.trace_id]
    assert output_of(same_rows["x"]) == output_of(rows["x"]) and same_rows["x"].reused
    assert ("step_started", "y") in kinds[same.trace_id] and output_of(same_rows["y"]) == 3
    assert ("step_started", "x") in kinds[again.trace_id] and not again_rows["x"].reused
    assert output_of(again_rows["x"])[0] == 10 and output_of(again_rows["y"]) == 11


@pytest.mark.parametrize("source, expected", [
    ("import re\nlen(re.findall('', 'a' * 20000))", "matched more than 10,000 times in one call"),
    ("import re\nre.search('a', 'a' * (2 ** 20 + 1))", "re searches strings of at most 1,048,576 characters"),
    ("import re\nre.sub('(a)', '-', 'b' * 10 + 'a' * 10001)", "matched more than 10,000 times"),
])
async def test_re_in_the_host_is_bounded(source, expected):
    """`re` runs in the server's process: its text, its matches per call are bounded."""
    sandbox = CodeSandbox(CodeBounds(memory_mb=64))
    try:
        began = time.monotonic()
        with pytest.raises(CodeError) as raised:
            await sandbox.run(source, {}, dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
        took = time.monotonic() - began
    finally:
        await sandbox.close()
    assert expected in raised.value.message and raised.value.message.startswith("ValueError: ")
    assert took < 2
