"""`orchestra workflow …`: templates and runs on a server, and a run's stream in the terminal.

`run` starts a run (and with `--watch` follows it), `watch` follows a run live,
`replay` shows a run again at its recorded pace (`--speed N` N times faster, 0 at
once), `reply` answers a run's question. `--json` prints data for scripts: lists and
objects as JSON, streams as one raw event object per line. A watched run that does not
succeed exits 1 with one line naming its status.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import typer
from rich.table import Table

from orchestra.cli.console import ExitCode, err, fail, handle_errors, out, print_json, success
from orchestra.cli.login import SERVER, TOKEN, connect
from orchestra.cli.render import Outcome, make_renderer, parse_ts
from orchestra.client import APIError, Client, Event

app = typer.Typer(help="Workflow templates and runs on a server; follow a run live.", no_args_is_help=True)

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
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
) -> None:
    """List workflow templates and your runs (newest runs first)."""
    if what not in WHATS:
        fail(f"unknown list {what!r}; use one of {', '.join(WHATS)}", ExitCode.USAGE)
    result: dict[str, list] = {}
    with connect(ctx, server, token) as client:
        if what in ("all", "templates"):
            result["templates"] = client.get("/workflow/template").get("templates", [])
        if what in ("all", "runs"):
            result["runs"] = client.get("/workflow/run").get("runs", [])
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
        table = Table("trace_id", "template", "status", "created_at", title="runs")
        for r in result["runs"]:
            table.add_row(_id(r, "trace_id", "id"), str(r.get("template_name") or r.get("template_id") or ""),
                          str(r.get("status", "")), str(r.get("created_at") or ""))
        out.print(table)


@app.command()
@handle_errors
def show(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
) -> None:
    """Show a run: status, step outputs, timestamps."""
    with connect(ctx, server, token) as client:
        run = client.get(f"/workflow/run/{trace_id}")
    if json_output:
        print_json(run)
        return
    body = run.get("run", run)
    out.print(f"[b]run {trace_id}[/]: {body.get('status')}", highlight=False)
    for step in body.get("steps") or []:
        if isinstance(step, dict):
            out.print(f"[b]{step.get('step_id') or step.get('id')}[/] · {step.get('status', '')}", highlight=False)
            if step.get("output"):
                out.print(str(step["output"]), markup=False, highlight=False)
            if step.get("error"):
                out.print(str(step["error"]), style="red", markup=False, highlight=False)


@app.command()
@handle_errors
def create(
    ctx: typer.Context,
    file: str = typer.Argument(..., help="Template JSON file ({name, description?, steps}); '-' reads stdin."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
) -> None:
    """Create a workflow template from a JSON file; prints its template_id."""
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
        body = json.loads(text)
    except ValueError as exc:
        fail(f"{file} is not valid JSON: {exc}", ExitCode.USAGE)
    with connect(ctx, server, token) as client:
        created = client.post("/workflow/template", json=body)
    if json_output:
        print_json(created)
        return
    template = created.get("template") if isinstance(created.get("template"), dict) else created
    sys.stdout.write(_id(template, "template_id", "id") + "\n")


@app.command()
@handle_errors
def run(
    ctx: typer.Context,
    template_id: str = typer.Argument(..., help="The template to run."),
    input_: str = typer.Option(..., "--input", "-i", help="The run's input text ('-' reads stdin)."),
    files: list[str] = typer.Option([], "--file", "-f", help="An uploaded file_id (repeatable)."),
    watch_: bool = typer.Option(False, "--watch", "-w", help="Follow the run until it ends."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
) -> None:
    """Start a run; print its trace_id, or with --watch follow it live."""
    text = sys.stdin.read() if input_ == "-" else input_
    with connect(ctx, server, token) as client:
        trace_id = client.start_run(template_id, text, files)
        if not watch_:
            if json_output:
                print_json({"trace_id": trace_id})
            else:
                sys.stdout.write(trace_id + "\n")
            return
        if not json_output:
            err.print(f"started run {trace_id}", highlight=False)
        _follow(client, trace_id, client.events(trace_id), json_output)


@app.command()
@handle_errors
def watch(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
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
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
) -> None:
    """Replay a run's events at their recorded pace (from the stored `ts` values)."""
    with connect(ctx, server, token) as client:
        _follow(client, trace_id, paced(client.events(trace_id), speed), json_output, interactive=False)


@app.command()
@handle_errors
def reply(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    text: str = typer.Argument(..., help="The answer ('-' reads stdin)."),
    request_id: Optional[str] = typer.Option(None, "--request-id", help="The question answered (from reply_requested)."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN,
) -> None:
    """Answer a run that waits for a reply."""
    content = sys.stdin.read().rstrip("\n") if text == "-" else text
    with connect(ctx, server, token) as client:
        client.reply(trace_id, content, request_id)
    success(f"replied to run {trace_id}")


@app.command()
@handle_errors
def cancel(
    ctx: typer.Context,
    trace_id: str = typer.Argument(..., help="The run's trace_id."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN,
) -> None:
    """Cancel a run."""
    with connect(ctx, server, token) as client:
        client.post(f"/workflow/cancel/{trace_id}")
    success(f"cancelled run {trace_id}")


def paced(events: Iterable[Event], speed: float, sleep=time.sleep) -> Iterator[Event]:
    """Yield events spaced as their `ts` values were, `speed` times faster (0: no waits)."""
    first: float | None = None
    began = time.monotonic()
    for event in events:
        ts = parse_ts(event.data.get("ts"))
        if speed > 0 and ts is not None:
            if first is None:
                first, began = ts, time.monotonic()
            wait = (ts - first) / speed - (time.monotonic() - began)
            if wait > 0:
                sleep(wait)
        yield event


def _follow(client: Client, trace_id: str, events: Iterable[Event], json_output: bool,
            *, interactive: bool = True) -> None:
    """Render `events`; exit non-zero when the run did not succeed."""

    def ask(request_id: str | None, prompt: str, step_id: str | None) -> None:
        answer = typer.prompt(f"{step_id or 'run'} asks: {prompt}\nyour answer", err=True)
        try:
            client.reply(trace_id, answer, request_id)
        except APIError as exc:
            err.print(f"[yellow]reply not taken:[/] {exc.message}", highlight=False)

    can_ask = interactive and sys.stdin.isatty()
    try:
        with make_renderer(trace_id, json_lines=json_output, console=out, ask=ask if can_ask else None) as view:
            for event in events:
                view.handle(event)
    except BrokenPipeError:  # `… --json | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    outcome = view.outcome
    if outcome.status is None:  # the stream ended (204) without showing the end: ask the record
        record = client.get(f"/workflow/run/{trace_id}")
        outcome = Outcome(status=str(record.get("run", record).get("status")))
    if outcome.status != "succeeded":
        detail = f": {outcome.error}" if outcome.error else ""
        fail(f"run {trace_id} {outcome.status}{detail}", ExitCode.ERROR)
