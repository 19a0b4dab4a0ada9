"""`orchestra worker …`: the signed-in user's workers, through the server's API.

Workers belong to a user, so these commands talk to `/api/v1/agent/worker` with the
kept login (or `--server`/`--token`), never to the store. `create` prints only the new
worker_id on stdout, so `WORKER=$(orchestra worker create …)` works; `--provider`
takes a provider_id or a provider's exact name (looked up among the worker's workspace's
providers, then the instance-wide ones: `GET /provider`).
`--workspace` (or `orchestra --workspace`, or $ORCHESTRA_WORKSPACE; an id or exact name)
is where `create` puts the worker, what `list` lists, and where `show`, `update` and
`delete` look a worker's name up (SPEC §16).
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    WORKSPACE,
    connect,
    resolve_named,
    resolve_provider,
    show_fields,
    workspace_scope,
)
from orchestra.cli.remote import without_message as _worker

app = typer.Typer(help="Your workers on a server: list, create, show, update, delete.", no_args_is_help=True)

FIELDS = ("worker_id", "name", "workspace_id", "description", "provider_id", "provider_name", "model", "tools", "bound_skill",
          "system_prompt", "created_at", "updated_at")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="worker")


@app.command("list")
@handle_errors
def list_(
    ctx: typer.Context, workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """List your workers and your workspaces' (--workspace: that one's only)."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        workers = client.get_all("/agent/worker", "workers", params=workspace_scope(client, workspace))
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
    model: str | None = typer.Option(None, "--model", "-m", help="A model (default: the provider's)."),
    tools: list[str] = typer.Option([], "--tool", "-t", help="A tool name from the catalog (repeatable)."),
    skill: str | None = typer.Option(None, "--skill", help="The name of a skill to bind."),
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="The worker's system prompt."),
    description: str | None = typer.Option(None, "--description", help="A description."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Create a worker (in --workspace; default your personal one); prints its worker_id alone on stdout."""
    with connect(ctx, server, token) as client:
        where = workspace_scope(client, workspace)
        body: dict[str, Any] = {"name": name, "provider_id": _provider(client, provider, where.get("workspace_id")),
                                "tools": list(tools), **where}
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


def _provider(client, ref: str, workspace_id: str | None) -> str:
    """The provider_id of `ref` for a worker of `workspace_id` (None: your personal one):
    one of that workspace's providers, else an instance-wide one."""
    if workspace_id is None:
        personal = [w["workspace_id"] for w in client.get("/workspace").get("workspaces", []) if w.get("personal")]
        workspace_id = personal[0] if personal else None
    return resolve_provider(client, ref, ExitCode.USAGE, workspace_id, instance_too=True)


def _resolve(client, ref: str, workspace: str | None = None) -> str:
    """The worker_id of `ref`: one of your workers' id or exact name, looked up in
    `workspace` when one is named (exit 3 naming the workers there are when none matches)."""
    return resolve_named(client, "/agent/worker", "workers", "worker_id", ref, "worker",
                         params=workspace_scope(client, workspace))


@app.command()
@handle_errors
def show(
    ctx: typer.Context,
    worker_id: str = typer.Argument(..., help="The worker's worker_id or name."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Show one of your workers (a name is looked up in --workspace when given)."""
    with connect(ctx, server, token) as client:
        worker = _worker(client.get(f"/agent/worker/{_resolve(client, worker_id, workspace)}"))
    show_fields(worker, FIELDS, json_output)


@app.command()
@handle_errors
def update(
    ctx: typer.Context,
    worker_id: str = typer.Argument(..., help="The worker's worker_id or name."),
    name: str | None = typer.Option(None, "--name", help="A new name."),
    provider: str | None = typer.Option(None, "--provider", "-p", help="A provider_id or a provider's exact name."),
    model: str | None = typer.Option(None, "--model", "-m", help="A model."),
    default_model: bool = typer.Option(False, "--default-model", help="Use the provider's model_id."),
    tools: list[str] | None = typer.Option(None, "--tool", "-t",
                                              help="Replace the tools with these (repeatable)."),
    no_tools: bool = typer.Option(False, "--no-tools", help="Remove every tool."),
    skill: str | None = typer.Option(None, "--skill", help="The name of a skill to bind."),
    no_skill: bool = typer.Option(False, "--no-skill", help="Unbind the skill."),
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="A new system prompt."),
    description: str | None = typer.Option(None, "--description", help="A new description."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Change one of your workers (a name is looked up in --workspace when given); only the fields given change."""
    for a, b, one, other in ((model, default_model, "--model", "--default-model"),
                             (tools, no_tools, "--tool", "--no-tools"), (skill, no_skill, "--skill", "--no-skill")):
        if a and b:
            fail(f"{one} and {other} exclude each other", ExitCode.USAGE)
    body: dict[str, Any] = {k: v for k, v in (("name", name), ("model", model), ("tools", tools or None),
                                              ("bound_skill", skill), ("system_prompt", system_prompt),
                                              ("description", description)) if v is not None}
    body.update({k: empty for k, empty, flag in (("model", None, default_model), ("tools", [], no_tools),
                                                 ("bound_skill", None, no_skill)) if flag})
    if not body and provider is None:
        fail("nothing to change: give --name, --provider, --model, --tool, --skill, --system-prompt, "
             "--description or one of the --no-… / --default-model flags", ExitCode.USAGE)
    with connect(ctx, server, token) as client:
        worker_id = _resolve(client, worker_id, workspace)
        if provider is not None:
            stored = _worker(client.get(f"/agent/worker/{worker_id}"))
            body["provider_id"] = _provider(client, provider, stored.get("workspace_id"))
        updated = _worker(client.put(f"/agent/worker/{worker_id}", json=body))
    if json_output:
        print_json(updated)
    success(f"updated worker {updated.get('name')} ({worker_id})")


@app.command()
@handle_errors
def delete(
    ctx: typer.Context,
    worker_id: str = typer.Argument(..., help="The worker's worker_id or name."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN,
) -> None:
    """Delete one of your workers (a name is looked up in --workspace when given)."""
    with connect(ctx, server, token) as client:
        worker_id = _resolve(client, worker_id, workspace)
        client.request("DELETE", f"/agent/worker/{worker_id}")
    success(f"deleted worker {worker_id}")
