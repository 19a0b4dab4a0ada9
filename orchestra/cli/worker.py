"""`orchestra worker …`: the signed-in user's workers, through the server's API.

Workers belong to a user, so these commands talk to `/api/v1/agent/worker` with the
kept login (or `--server`/`--token`), never to the store. `create` prints only the new
worker_id on stdout, so `WORKER=$(orchestra worker create …)` works; `--provider`
takes a provider_id or a provider's exact name (looked up in `GET /provider`).
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer
from rich.table import Table

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, success
from orchestra.cli.login import SERVER, TOKEN, connect
from orchestra.client import Client

app = typer.Typer(help="Your workers on a server: list, create, show, delete.", no_args_is_help=True)

JSON = typer.Option(False, "--json", help="Print JSON (the objects as the API returns them).")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="worker")


def resolve_provider(client: Client, ref: str) -> str:
    """The provider_id for `ref`: a provider_id, else a provider's exact name."""
    providers = client.get("/provider").get("providers", [])
    for p in providers:
        if ref in (p.get("provider_id"), p.get("id")):
            return str(p.get("provider_id") or p.get("id"))
    named = [p for p in providers if p.get("name") == ref]
    if not named:
        known = ", ".join(sorted(str(p.get("name")) for p in providers)) or "none registered"
        fail(f"unknown provider {ref!r} (no provider has that id or name; known: {known})", ExitCode.USAGE)
    return str(named[0].get("provider_id") or named[0].get("id"))


def _worker(body: dict[str, Any]) -> dict[str, Any]:
    """The worker object of an answer, without the `message` field."""
    return {k: v for k, v in body.items() if k != "message"}


@app.command("list")
@handle_errors
def list_(
    ctx: typer.Context,
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
) -> None:
    """List your workers."""
    with connect(ctx, server, token) as client:
        workers = client.get("/agent/worker").get("workers", [])
    if json_output:
        print_json(workers)
        return
    table = Table("name", "provider", "model", "tools", "skill", title="workers")
    table.add_column("worker_id", no_wrap=True, min_width=36)
    for w in workers:
        table.add_row(str(w.get("name", "")), str(w.get("provider_name") or w.get("provider_id") or ""),
                      str(w.get("model") or ""), ", ".join(w.get("tools") or []),
                      str(w.get("bound_skill") or ""), str(w.get("worker_id") or w.get("id") or ""))
    out.print(table)


@app.command()
@handle_errors
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The worker's name."),
    provider: str = typer.Option(..., "--provider", "-p", help="A provider_id or a provider's exact name."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="A model (default: the provider's)."),
    tools: list[str] = typer.Option([], "--tool", "-t", help="A tool name from the catalog (repeatable)."),
    skill: Optional[str] = typer.Option(None, "--skill", help="The name of a skill to bind."),
    system_prompt: Optional[str] = typer.Option(None, "--system-prompt", help="The worker's system prompt."),
    description: Optional[str] = typer.Option(None, "--description", help="A description."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
) -> None:
    """Create a worker; prints its worker_id alone on stdout."""
    with connect(ctx, server, token) as client:
        body: dict[str, Any] = {"name": name, "provider_id": resolve_provider(client, provider),
                                "tools": list(tools)}
        for key, value in (("model", model), ("bound_skill", skill),
                           ("system_prompt", system_prompt), ("description", description)):
            if value is not None:
                body[key] = value
        created = _worker(client.post("/agent/worker", json=body))
    worker_id = str(created.get("worker_id") or created.get("id") or "")
    if json_output:
        print_json(created)
    else:
        sys.stdout.write(worker_id + "\n")
        sys.stdout.flush()
    success(f"created worker {name} ({worker_id})")


@app.command()
@handle_errors
def show(
    ctx: typer.Context,
    worker_id: str = typer.Argument(..., help="The worker's worker_id."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN, json_output: bool = JSON,
) -> None:
    """Show one of your workers."""
    with connect(ctx, server, token) as client:
        worker = _worker(client.get(f"/agent/worker/{worker_id}"))
    if json_output:
        print_json(worker)
        return
    for key in ("worker_id", "name", "description", "provider_id", "provider_name", "model",
                "tools", "bound_skill", "system_prompt", "created_at", "updated_at"):
        value = worker.get(key)
        shown = ", ".join(value) if isinstance(value, list) else ("" if value is None else str(value))
        out.print(f"[b]{key}[/]: ", end="", highlight=False)
        out.print(shown, markup=False, highlight=False)


@app.command()
@handle_errors
def delete(
    ctx: typer.Context,
    worker_id: str = typer.Argument(..., help="The worker's worker_id."),
    server: Optional[str] = SERVER, token: Optional[str] = TOKEN,
) -> None:
    """Delete one of your workers."""
    with connect(ctx, server, token) as client:
        client.request("DELETE", f"/agent/worker/{worker_id}")
    success(f"deleted worker {worker_id}")
