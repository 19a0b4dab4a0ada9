"""`orchestra usage`: what runs' model calls used and cost, grouped (GET /api/v1/usage)."""

from __future__ import annotations

import typer

from orchestra.cli.console import handle_errors, out, print_json
from orchestra.cli.remote import JSON, SERVER, TOKEN, WORKSPACE, connect, workspace_scope

GROUPS = ("day", "template", "model", "provider", "user", "workspace")


@handle_errors
def usage(
    ctx: typer.Context,
    by: str = typer.Option("day", "--by", help="Group by day, template, model, provider, user or workspace."),
    start: str | None = typer.Option(None, "--from", help="From this UTC date (2026-11-01) or date-time."),
    end: str | None = typer.Option(None, "--to", help="Up to this UTC date (included) or date-time."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Model calls, tokens and cost (USD) of your runs and your workspaces' (an administrator's: everyone's), grouped;
    with --workspace, that workspace's runs only."""
    from rich.table import Table

    params = {"group_by": by} | ({"from": start} if start else {}) | ({"to": end} if end else {})
    with connect(ctx, server, token) as client:
        params |= workspace_scope(client, workspace)
        rows = client.get("/usage", params=params).get("rows", [])
    if json_output:
        print_json(rows)
        return
    table = Table(by, "runs", "calls", "input tokens", "output tokens", "cost (USD)")
    for row in rows:
        cost = row.get("cost_usd")
        table.add_row(str(row.get("name") or row.get("key")), str(row.get("runs")), str(row.get("calls")),
                      str(row.get("input_tokens")), str(row.get("output_tokens")),
                      cost if cost is not None else "unknown")
    out.print(table)


def register(root: typer.Typer) -> None:
    root.command("usage")(usage)
