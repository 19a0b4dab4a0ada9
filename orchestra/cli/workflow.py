"""`orchestra workflow …`: runs on a server, and a run's stream in the terminal.

`run` starts a run (and with `--watch` follows it), `watch` follows a run live,
`replay` shows a run again at its recorded pace (`--speed N` N times faster, 0 at
once), `reply` answers a run's question, `cancel` stops it. `--json` prints data for
scripts: lists and objects as JSON, streams as one raw event object per line. A watched
run that does not succeed exits 1 with one line naming its status. Templates have their
own group (`orchestra template …`); `workflow create` is kept as its alias.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from orchestra.cli.console import ExitCode, err, fail, handle_errors, out, print_json, success
from orchestra.cli.origin import started_by
from orchestra.cli.remote import SERVER, TOKEN, WORKSPACE, connect, read_text_arg, workspace_id
from orchestra.vocabulary import EventKind, RunStatus, StepStatus

if TYPE_CHECKING:
    from orchestra.client import Client, Event

app = typer.Typer(help="Workflow runs on a server: run, list, show, watch, replay, reply, retry, fork, budget, cancel.",
                  no_args_is_help=True)

JSON = typer.Option(False, "--json", help="Print JSON (streams: one raw event object per line).")
WHATS = ("all", "templates", "runs")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="workflow")


def _id(item: dict[str, Any], *names: str) -> str:
    for name in names:
        if item.get(name):
            return str(item[name])
    return ""


@app.command("list")
@handle_errors
def list_(
    ctx: typer.Context,
    what: str = typer.Argument("all", help="all, templates or runs."),
    all_users: bool = typer.Option(False, "--all", help="Runs of every user (ADMINISTRATOR and above)."),
    limit: int | None = typer.Option(None, "--limit", min=1, max=1000, help="At most this many runs (100)."),
    cursor: str | None = typer.Option(None, "--cursor", help="Runs after an earlier list's 'more' cursor."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """List workflow templates and your runs (newest runs first); --workspace: that one's only."""
    from rich.table import Table

    if what not in WHATS:
        fail(f"unknown list {what!r}; use one of {', '.join(WHATS)}", ExitCode.USAGE)
    result: dict[str, Any] = {}
    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        scope = {"workspace_id": wid} if wid else {}
        if what in ("all", "templates"):
            result["templates"] = client.get_all("/workflow/template", "templates", params=scope)
        if what in ("all", "runs"):
            page = client.get("/workflow/run", params={**_run_params(all_users, limit, cursor), **scope})
            result["runs"] = page.get("runs", [])
            if page.get("next_cursor"):
                result["next_cursor"] = page["next_cursor"]
    if json_output:
        print_json(result)
        return
    if "templates" in result:
        table = Table("template_id", "name", "steps", "description", title="templates")
        for t in result["templates"]:
            table.add_row(_id(t, "template_id", "id"), str(t.get("name", "")),
                          str(len(t.get("steps") or [])), str(t.get("description") or ""))
        out.print(table)
    if "runs" in result:
        table = Table("trace_id", "template", "status", "started by", "created_at", title="runs")
        for r in result["runs"]:
            table.add_row(_id(r, "trace_id", "id"), str(r.get("template_name") or r.get("template_id") or ""),
                          str(r.get("status", "")), started_by(r), str(r.get("created_at") or ""))
        out.print(table)
    if result.get("next_cursor"):
        err.print(f"more runs: orchestra workflow list runs --cursor {result['next_cursor']}",
                  highlight=False, markup=False)


def _shown(value: Any) -> str:
    """A value as `workflow show` prints it: text as it is, JSON indented."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


@app.command()
@handle_errors
def show(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Show a run: status, step outputs, timestamps."""
    with connect(ctx, server, token) as client:
        run = client.get(f"/workflow/run/{trace_id}")
        body = run.get("run", run)
        children = {} if json_output else _waiting_children(client, body)
    if json_output:
        print_json(run)
        return
    money = "".join(f" · {label} ${body[key]}" for key, label in (("cost_usd", "cost"), ("budget_usd", "budget"))
                    if body.get(key) is not None)
    out.print(f"[b]run {trace_id}[/]: {body.get('status')}{money}", highlight=False)
    out.print(f"started by: {started_by(body, full=True)}", markup=False, highlight=False)
    for step in body.get("steps") or []:
        if isinstance(step, dict):
            name = step.get("path") or step.get("step_id") or step.get("id")  # research[2].facts
            cost = f" · ${step['cost_usd']}" if step.get("cost_usd") is not None else ""
            out.print(f"[b]{escape(str(name))}[/] · {step.get('status', '')}{cost}", highlight=False)
            if step.get("output") is not None and step.get("output") != "":
                out.print(_shown(step["output"]), markup=False, highlight=False)
            if step.get("error"):
                out.print(str(step["error"]), style="red", markup=False, highlight=False)
            child = children.get(str(step.get("child_trace_id")))
            if child is not None:
                out.print(f"  child run {step['child_trace_id']}: {child.get('status')}", markup=False, highlight=False)
                _print_questions(str(step["child_trace_id"]), child.get("pending_replies") or [])
    _print_questions(trace_id, body.get("pending_replies") or [])
    if body.get("output") is not None:
        out.print("[b]output[/]", highlight=False)
        out.print(_shown(body["output"]), markup=False, highlight=False)


_ENDED_STEPS = {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED, StepStatus.SKIPPED,
                StepStatus.INTERRUPTED}


def _waiting_children(client: Client, body: dict[str, Any], most: int = 10) -> dict[str, dict[str, Any]]:
    """The records of the run's child runs still going (its first `most`), by trace id."""
    ids = [str(s["child_trace_id"]) for s in body.get("steps") or []
           if isinstance(s, dict) and s.get("child_trace_id") and s.get("status") not in _ENDED_STEPS]
    found = {}
    for child in ids[:most]:
        record = client.get(f"/workflow/run/{child}")
        found[child] = record.get("run", record)
    return found


def _print_questions(trace_id: str, pending: list[dict[str, Any]]) -> None:
    """A run's open questions, each with the command that answers it."""
    for question in pending:
        out.print(f"  waiting for a reply at {question.get('step_id')}: {question.get('prompt')}",
                  style="yellow", markup=False, highlight=False)
        out.print(f"    answer with: orchestra workflow reply {trace_id} 'YOUR ANSWER' "
                  f"--request-id {question.get('request_id')}", markup=False, highlight=False)


@app.command()
@handle_errors
def create(
    ctx: typer.Context,
    file: str = typer.Argument(..., help="Template JSON file ({name, description?, steps}); '-' reads stdin."),
    shared: bool | None = typer.Option(None, "--shared/--private", help="Share with every user (admins)."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Create a workflow template from a JSON file (in --workspace; default your personal
    one); prints its template_id (same as `orchestra template create`)."""
    from orchestra.cli.template import create_from_file

    create_from_file(ctx, file, shared, server, token, json_output, workspace)


@app.command()
@handle_errors
def run(
    ctx: typer.Context,
    template: str = typer.Argument(..., help="The template to run: a template_id or its exact name."),
    input_: str | None = typer.Option(None, "--input", "-i",
                                         help="The run's input text ('-' reads stdin; default: none)."),
    input_json: bool = typer.Option(False, "--input-json", "-I",
                                    help="Send --input as a JSON value (a template with input_schema)."),
    files: list[str] = typer.Option([], "--file", "-f", help="An uploaded file_id (repeatable)."),
    version: int | None = typer.Option(None, "--version", min=1,
                                       help="Run this version of the template (default: the latest)."),
    budget: str | None = typer.Option(None, "--budget", metavar="USD",
                                      help="The run's budget in USD, e.g. 0.50 (instead of the template's limits.budget_usd)."),
    watch_: bool = typer.Option(False, "--watch", "-w", help="Follow the run until it ends."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Start a run (of the template's workspace); print its trace_id, or with --watch
    follow it live. A template name is looked up in --workspace when given."""
    from orchestra.cli.template import template_id

    text: Any = None if input_ is None else (sys.stdin.read() if input_ == "-" else input_)
    if input_json and text is not None:
        try:
            text = json.loads(text)
        except ValueError as exc:
            fail(f"--input is not JSON: {exc}", ExitCode.USAGE)
    with connect(ctx, server, token) as client:
        tid = template_id(client, template, workspace_id(client, workspace))
        trace_id = client.start_run(tid, text, files, version=version, budget_usd=budget)
        if not watch_:
            if json_output:
                print_json({"trace_id": trace_id})
            else:
                sys.stdout.write(trace_id + "\n")
            return
        _follow(client, trace_id, client.events(trace_id), json_output)


@app.command()
@handle_errors
def watch(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Follow a run live (a finished run is shown from its record) until it ends."""
    with connect(ctx, server, token) as client:
        _follow(client, trace_id, client.events(trace_id), json_output)


@app.command()
@handle_errors
def replay(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    speed: float = typer.Option(1.0, "--speed", min=0.0,
                                help="N times faster than recorded; 0 = as fast as possible."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Replay a run's events at their recorded pace (from the stored `ts` values)."""
    with connect(ctx, server, token) as client:
        _follow(client, trace_id, paced(client.events(trace_id), speed), json_output, replay=True)


@app.command()
@handle_errors
def retry(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="A failed, cancelled or interrupted run's trace_id."),
    from_step: str | None = typer.Option(None, "--from-step", help="Also run this step and its descendants again."),
    watch_: bool = typer.Option(False, "--watch", "-w", help="Follow the new run until it ends."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Run an ended run again, reusing every step that succeeded; prints the new trace_id."""
    with connect(ctx, server, token) as client:
        body = {"from_step": from_step} if from_step else {}
        new_id = client.post(f"/workflow/run/{trace_id}/retry", json=body)["trace_id"]
        if not watch_:
            if json_output:
                print_json({"trace_id": new_id, "retry_of": trace_id})
            else:
                sys.stdout.write(new_id + "\n")
            return
        _follow(client, new_id, client.events(new_id), json_output)


@app.command()
@handle_errors
def reply(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    text: str = typer.Argument(..., help="The answer ('-' reads stdin)."),
    request_id: str | None = typer.Option(None, "--request-id", help="The question answered (from reply_requested)."),
    as_json: bool = typer.Option(False, "--json-content", "-J",
                                 help="Send the answer as a JSON value (a question with a schema)."),
    server: str | None = SERVER, token: str | None = TOKEN,
) -> None:
    """Answer a run that waits for a reply (a child run's question shown on its parent is
    answered on the child run that asks it)."""
    from orchestra.cli.replies import send_reply

    content: Any = read_text_arg(text)
    if as_json:
        try:
            content = json.loads(content)
        except ValueError as exc:
            fail(f"the answer is not JSON: {exc}", ExitCode.USAGE)
    with connect(ctx, server, token) as client:
        answered = send_reply(client, trace_id, content, request_id)
    below = "" if answered == trace_id else f" (asked by its child run {answered})"
    success(f"replied to run {trace_id}{below}")


@app.command()
@handle_errors
def budget(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="A run waiting for budget (waiting_budget)."),
    add: str = typer.Option(..., "--add", help="USD to add to its budget, e.g. 0.50."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Raise the budget that stopped a run (its own, or a parent's); it goes on where it stopped."""
    with connect(ctx, server, token) as client:
        answer = client.post(f"/workflow/run/{trace_id}/budget", json={"add_usd": add})
    if json_output:
        print_json(answer)
        return
    whose = answer.get("budget_trace_id")
    budget = "budget" if whose in (None, trace_id) else f"the budget of run {whose} above it"
    success(f"run {trace_id}: {budget} now ${answer.get('budget_usd')} "
            f"(spent ${answer.get('cost_usd') or '0'}); it is {answer.get('status')} again")


@app.command()
@handle_errors
def cancel(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    server: str | None = SERVER, token: str | None = TOKEN,
) -> None:
    """Cancel a run."""
    with connect(ctx, server, token) as client:
        client.post(f"/workflow/cancel/{trace_id}")
    success(f"cancelled run {trace_id}")


@app.command()
@handle_errors
def events(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    after: int = typer.Option(0, "--after", min=0, help="Only events after this seq."),
    server: str | None = SERVER, token: str | None = TOKEN,
    json_output: bool = typer.Option(False, "--json", help="Accepted like every data command's: the output is JSON either way."),
) -> None:
    """Print a run's stored events as JSON (`[{seq, kind, data}]`), without waiting for more."""
    events: list[dict[str, Any]] = []
    with connect(ctx, server, token) as client:
        while after is not None:  # page by page (at most 1,000 events each)
            page = client.get(f"/workflow/run/{trace_id}/events", params={"after": after})
            events += page.get("events", [])
            after = page.get("next_after")
    print_json(events)


def _run_params(all_users: bool, limit: int | None, cursor: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"all": "1"} if all_users else {}
    if limit is not None:
        params["limit"] = limit
    if cursor:
        params["cursor"] = cursor
    return params


def paced(events: Iterable[Event], speed: float, sleep=time.sleep,
          clock=time.monotonic) -> Iterator[Event]:
    """Yield events spaced as their `ts` values were, `speed` times faster (0: no waits).
    `sleep` and `clock` are the waits and the time it reads (tests pass their own)."""
    from orchestra.timestamps import parse_ts

    first: float | None = None
    began = clock()
    for event in events:
        ts = parse_ts(event.data.get("ts"))
        if speed > 0 and ts is not None:
            if first is None:
                first, began = ts, clock()
            wait = (ts - first) / speed - (clock() - began)
            if wait > 0:
                sleep(wait)
        yield event


def _follow(client: Client, trace_id: str, events: Iterable[Event], json_output: bool,
            *, replay: bool = False) -> None:
    """Render `events`; exit non-zero when the run did not succeed. On a terminal (not a
    replay) questions are put at the prompt while the events keep coming."""
    from orchestra.cli.render import LiveRenderer, Outcome, make_renderer

    try:
        with make_renderer(trace_id, json_lines=json_output, console=out, replay=replay) as view:
            if isinstance(view, LiveRenderer) and not replay and sys.stdin.isatty():
                _follow_answering(client, trace_id, events, view)
            else:
                for event in events:
                    view.handle(event)
    except BrokenPipeError:  # `… --json | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    outcome = view.outcome
    if outcome.status is None:  # the stream ended (204) without showing the end: ask the record
        record = client.get(f"/workflow/run/{trace_id}")
        outcome = Outcome(status=str(record.get("run", record).get("status")))
        outcome.error = record.get("run", record).get("error")
    if outcome.status != RunStatus.SUCCEEDED:
        shown = not json_output and view.outcome.status is not None  # the view printed the reason
        detail = f": {outcome.error}" if outcome.error and not shown else ""
        fail(f"run {trace_id} {outcome.status}{detail}", ExitCode.ERROR)


def _follow_answering(client: Client, trace_id: str, events: Iterable[Event], view) -> None:
    """The live view with questions answered at the prompt (see orchestra.cli.prompt)."""
    from orchestra.cli.answer_shape import example as answer_example
    from orchestra.cli.prompt import EventPump, PromptArea, Question, Unanswerable, ask
    from orchestra.cli.replies import send_reply
    from orchestra.client import APIError

    schemas: dict[str | None, Any] = {}  # request_id -> the question's schema (a JSON answer)

    def send(question: Question, answer: str) -> str | None:
        request_id = question.request_id
        content: Any = answer
        if schemas.get(request_id) is not None:
            try:
                content = json.loads(answer)
            except ValueError:
                example = json.dumps(answer_example(schemas[request_id]), ensure_ascii=False)[:200]
                return f"that is not JSON; the answer is JSON such as {example}"
        try:
            send_reply(client, trace_id, content, request_id, asked_on=question.asked_on)
        except APIError as exc:
            if exc.status == 409:  # nothing waits for this answer: another will not help
                raise Unanswerable(exc.message) from None
            return exc.message
        return None

    pump = EventPump(events)
    for event in pump:
        view.handle(event)
        if event.kind == EventKind.REPLY_REQUESTED:
            schemas[event.data.get("request_id")] = event.data.get("schema")
            question = Question.of(event, trace_id)
            view.pause()
            area = PromptArea(lambda text: err.print(text, end="", highlight=False, markup=False, soft_wrap=True),
                              width=view.console.width)
            note = None
            try:
                note = ask(question, pump, lambda answer, asked=question: send(asked, answer), area.say,
                           typed=area.typed)
            finally:
                view.resume(area.rows, note)  # one copy of the view on screen, live again
