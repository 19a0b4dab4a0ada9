"""`orchestra audit list | export | verify` (SPEC §16): the audit log. `list` and `export`
read it through the server (GET /api/v1/audit: a SUPER_ADMINISTRATOR's token reads every
chain, a workspace admin's their workspaces', `--workspace` one of them); `verify`
reads the store itself, like `orchestra db` (`--db`/`--home`), and checks every chain."""

from __future__ import annotations

import json
import sys

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, run, success
from orchestra.cli.remote import JSON, SERVER, TOKEN, WORKSPACE, connect, workspace_id
from orchestra.cli.store import settings_from

app = typer.Typer(help="The audit log: who changed what (list and export through the server; "
                       "verify straight against the store).", no_args_is_help=True)

ACTOR = typer.Option(None, "--actor", help="Only entries by this user (user_id or user_name).")
ACTION = typer.Option(None, "--action", help="Only this action, exactly (template.update).")
TARGET = typer.Option(None, "--target", help="Only entries about this resource id.")
SINCE = typer.Option(None, "--from", help="From this UTC date (2026-12-01) or date-time, included.")
UNTIL = typer.Option(None, "--to", help="Before this UTC date or date-time (excluded).")


def _filters(actor, action, target, since, until) -> dict[str, str]:
    given = {"actor": actor, "action": action, "target_id": target, "from": since, "to": until}
    return {k: v for k, v in given.items() if v}


@app.command("list")
@handle_errors
def list_entries(
    ctx: typer.Context, actor: str | None = ACTOR, action: str | None = ACTION, target: str | None = TARGET,
    since: str | None = SINCE, until: str | None = UNTIL,
    limit: int = typer.Option(50, "--limit", min=1, max=1000, help="At most this many entries (newest first)."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """The newest entries, filtered."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        entries = client.get("/audit", params={**_filters(actor, action, target, since, until),
                                               **({"workspace_id": wid} if wid else {}),
                                               "limit": str(limit)}).get("entries", [])
    if json_output:
        print_json(entries)
        return
    table = Table("at", "seq", "actor", "action", "target", "request")
    for entry in entries:
        who = entry.get("actor") or {}
        what = entry.get("target") or {}
        table.add_row(str(entry.get("at")), str(entry.get("seq")),
                      f"{who.get('user_name') or who.get('user_id') or '-'} ({who.get('via')})",
                      str(entry.get("action")), f"{what.get('type')} {what.get('name') or what.get('id') or ''}",
                      str(entry.get("request_id") or ""))
    out.print(table)


@app.command("export")
@handle_errors
def export(
    ctx: typer.Context, actor: str | None = ACTOR, action: str | None = ACTION, target: str | None = TARGET,
    since: str | None = SINCE, until: str | None = UNTIL, workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN,
) -> None:
    """Every entry that matches, newest first, one JSON object a line (all pages)."""
    params = {**_filters(actor, action, target, since, until), "limit": "1000"}
    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        if wid:
            params["workspace_id"] = wid
        cursor = None
        while True:
            page = client.get("/audit", params={**params, **({"cursor": cursor} if cursor else {})})
            for entry in page.get("entries", []):
                sys.stdout.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")
            cursor = page.get("next_cursor")
            if not cursor:
                break
    sys.stdout.flush()


@app.command()
@handle_errors
def verify(
    ctx: typer.Context,
    db: str | None = typer.Option(None, "--db", help="Database URL (overrides ORCHESTRA_DATABASE_URL)."),
) -> None:
    """Check every chain from its first kept entry to its head: exits 1 naming the first
    edited, removed or reordered entry of each broken chain, 0 when all are intact."""
    from orchestra.cli.store import open_core
    from orchestra.services import audit_chain

    async def go():
        async with open_core(settings_from(ctx, database_url=db)) as core:
            return await audit_chain.verify(core)

    verdict = run(go())
    if not verdict.intact:
        for problem in verdict.problems[:-1]:
            out.print(problem, markup=False, highlight=False)
        fail(verdict.problems[-1], ExitCode.ERROR)
    success(f"the audit log is intact: {verdict.entries} entr{'y' if verdict.entries == 1 else 'ies'} "
            f"in {verdict.chains} chain(s)")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="audit")
