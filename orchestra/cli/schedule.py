"""`orchestra schedule …`: runs started on a clock, through `/api/v1/workflow/schedule`
(SPEC §11). A schedule runs as you; TEMPLATE takes a template_id or an exact name.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from orchestra.cli.console import ExitCode, err, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    WORKSPACE,
    YES,
    confirm,
    connect,
    show_fields,
    workspace_id,
)

app = typer.Typer(help="Schedules: add, list, show, fires, update, enable, disable, remove.", no_args_is_help=True)

PATH = "/workflow/schedule"
SCHEDULE = typer.Argument(..., help="A schedule_id.")
FIELDS = ("schedule_id", "template_id", "cron", "timezone", "input", "overlap", "catchup",
          "catchup_window_seconds", "enabled", "next_fires", "last_fire", "created_at")
BODY_FIELDS = ("template_id", "cron", "timezone", "input", "overlap", "catchup",
               "catchup_window_seconds", "enabled")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="schedule")


def _input(text: str | None, as_json: bool) -> Any:
    if text is None:
        return None
    if not as_json:
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        fail(f"--input is not valid JSON: {exc}", ExitCode.USAGE)


def fire_line(fire: dict[str, Any] | None) -> str:
    """A fire as one line: `2026-03-06T09:00:00-05:00 · started · run 9c41…` (the whole
    trace_id, to copy), or its outcome and why no run started."""
    if not fire:
        return "none yet"
    parts = [str(fire.get("due_at") or ""), str(fire.get("outcome") or "")]
    if fire.get("trace_id"):
        status = f" ({fire['run_status']})" if fire.get("run_status") else ""
        parts.append(f"run {fire['trace_id']}{status}")
    if fire.get("error"):
        parts.append(str(fire["error"]))
    return " · ".join(p for p in parts if p)


def _show(view: dict[str, Any], json_output: bool) -> None:
    if json_output:
        print_json(view)
        return
    show_fields({**view, "last_fire": fire_line(view.get("last_fire"))}, FIELDS)


@app.command()
@handle_errors
def add(
    ctx: typer.Context,
    template: str = typer.Argument(..., help="A template_id or a template's exact name."),
    cron: str = typer.Argument(..., help="Five fields, quoted: '0 9 * * 1-5'."),
    timezone: str = typer.Option("UTC", "--timezone", "--tz", help="An IANA zone (Europe/Paris)."),
    input_text: str | None = typer.Option(None, "--input", help="The runs' input (text)."),
    input_json: bool = typer.Option(False, "--input-json", help="Read --input as JSON (templates with input_schema)."),
    overlap: str = typer.Option("skip", "--overlap", help="skip, allow or cancel_previous."),
    catchup: str = typer.Option("latest", "--catchup", help="none, latest or all."),
    window: int = typer.Option(3600, "--catchup-window", help="Seconds back that missed fires are made up."),
    disabled: bool = typer.Option(False, "--disabled", help="Save it without firing."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Add a schedule; prints its schedule_id, then its next fires."""
    from orchestra.cli.template import template_id

    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        body = {"template_id": template_id(client, template, wid), "cron": cron, "timezone": timezone,
                "input": _input(input_text, input_json), "overlap": overlap, "catchup": catchup,
                "catchup_window_seconds": window, "enabled": not disabled}
        if wid:
            body["workspace_id"] = wid
        created = client.post(PATH, json=body)
    view = created["schedule"]
    if json_output:
        print_json(view)
        return
    sys.stdout.write(created["schedule_id"] + "\n")
    success(f"added schedule {created['schedule_id']}; next: {', '.join(view['next_fires'][:3]) or 'none'}")


@app.command("list")
@handle_errors
def list_schedules(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
                   token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List your schedules and your workspaces' with their next fire and last outcome."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        rows = client.get_all(PATH, "schedules", params={"workspace_id": wid} if wid else None)
    if json_output:
        print_json(rows)
        return
    table = Table("cron", "timezone", "enabled", "next fire", "last fire", "outcome")
    table.add_column("schedule_id", no_wrap=True, min_width=36)
    for s in rows:
        last = s.get("last_fire") or {}
        table.add_row(s["cron"], s["timezone"], "yes" if s["enabled"] else "no",
                      (s["next_fires"] or [""])[0], last.get("due_at") or "", last.get("outcome") or "",
                      s["schedule_id"])
    out.print(table)


@app.command()
@handle_errors
def show(ctx: typer.Context, schedule: str = SCHEDULE, server: str | None = SERVER,
         token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Show a schedule: its next 5 fires (in its zone) and its last fire (all: `fires`)."""
    with connect(ctx, server, token) as client:
        _show(client.get(f"{PATH}/{schedule}")["schedule"], json_output)


@app.command()
@handle_errors
def fires(
    ctx: typer.Context, schedule: str = SCHEDULE,
    limit: int = typer.Option(20, "--limit", min=1, max=1000, help="At most this many fires (newest first)."),
    cursor: str | None = typer.Option(None, "--cursor", help="Older fires: an earlier list's 'more' cursor."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """List a schedule's fires, newest first: each due time's outcome and its run."""
    from rich.table import Table

    params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
    with connect(ctx, server, token) as client:
        page = client.get(f"{PATH}/{schedule}/fires", params=params)
    if json_output:
        print_json(page["fires"])
    else:
        table = Table("due", "fired", "outcome", "run status", "error", title=f"fires ({page['timezone']})")
        table.add_column("trace_id", no_wrap=True, min_width=36)
        for f in page["fires"]:
            table.add_row(f["due_at"], f["fired_at"], f["outcome"], f.get("run_status") or "",
                          f.get("error") or "", f.get("trace_id") or "")
        out.print(table)
        if not page["fires"]:
            err.print("no fires yet: the first due time has not come", highlight=False, markup=False)
    if page.get("next_cursor"):
        err.print(f"more fires: orchestra schedule fires {schedule} --cursor {page['next_cursor']}",
                  highlight=False, markup=False)


def _change(ctx: typer.Context, schedule: str, server: str | None, token: str | None,
            **changes: Any) -> dict[str, Any]:
    with connect(ctx, server, token) as client:
        current = client.get(f"{PATH}/{schedule}")["schedule"]
        body = {k: current[k] for k in BODY_FIELDS}
        body.update({k: v for k, v in changes.items() if v is not None})
        return client.put(f"{PATH}/{schedule}", json=body)["schedule"]


@app.command()
@handle_errors
def update(
    ctx: typer.Context, schedule: str = SCHEDULE,
    cron: str | None = typer.Option(None, "--cron", help="Five fields, quoted."),
    timezone: str | None = typer.Option(None, "--timezone", "--tz", help="An IANA zone."),
    input_text: str | None = typer.Option(None, "--input", help="The runs' input (text)."),
    input_json: bool = typer.Option(False, "--input-json", help="Read --input as JSON."),
    overlap: str | None = typer.Option(None, "--overlap", help="skip, allow or cancel_previous."),
    catchup: str | None = typer.Option(None, "--catchup", help="none, latest or all."),
    window: int | None = typer.Option(None, "--catchup-window", help="Seconds."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Change some fields of a schedule (the others are kept)."""
    view = _change(ctx, schedule, server, token, cron=cron, timezone=timezone,
                   input=_input(input_text, input_json), overlap=overlap, catchup=catchup,
                   catchup_window_seconds=window)
    _show(view, json_output)


@app.command()
@handle_errors
def enable(ctx: typer.Context, schedule: str = SCHEDULE, server: str | None = SERVER,
           token: str | None = TOKEN) -> None:
    """Fire again from now on (due times that passed while disabled are not made up)."""
    view = _change(ctx, schedule, server, token, enabled=True)
    success(f"enabled schedule {schedule}; next: {', '.join(view['next_fires'][:3])}")


@app.command()
@handle_errors
def disable(ctx: typer.Context, schedule: str = SCHEDULE, server: str | None = SERVER,
            token: str | None = TOKEN) -> None:
    """Stop firing (the schedule is kept)."""
    _change(ctx, schedule, server, token, enabled=False)
    success(f"disabled schedule {schedule}")


@app.command()
@handle_errors
def remove(ctx: typer.Context, schedule: str = SCHEDULE, yes: bool = YES, server: str | None = SERVER,
           token: str | None = TOKEN) -> None:
    """Remove a schedule (its runs stay)."""
    confirm(f"remove schedule {schedule}", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"{PATH}/{schedule}")
    success(f"removed schedule {schedule}")
