"""`orchestra node …`: the built-in system nodes through the server's `/api/v1/agent/node`."""

from __future__ import annotations

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    connect,
    resolve_provider,
    show_fields,
    without_message,
)

app = typer.Typer(help="System nodes on a server: list, show, set their provider and model.",
                  no_args_is_help=True)

NAME = typer.Argument(..., help="planner, reviewer or summarizer.")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="node")
    root.command("reload")(reload)


@handle_errors
def reload(ctx: typer.Context, server: str | None = SERVER, token: str | None = TOKEN,
           json_output: bool = JSON) -> None:
    """Make the server drop its cached workers and nodes and read them again (ADMINISTRATOR and above)."""
    with connect(ctx, server, token) as client:
        counts = without_message(client.post("/agent/reload"))
    if json_output:
        print_json(counts)
        return
    success("reloaded " + ", ".join(f"{v} {k}" for k, v in counts.items()))


def _described(node: dict) -> str:
    return (f"{node['name']}: provider {node.get('provider_name') or '(none)'}, "
            f"model {node.get('model') or '(provider default)'}")


@app.command("list")
@handle_errors
def list_nodes(ctx: typer.Context, server: str | None = SERVER, token: str | None = TOKEN,
               json_output: bool = JSON) -> None:
    """List the system nodes with their provider, model and fixed tools."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        nodes = client.get("/agent/node").get("nodes", [])
    if json_output:
        print_json(nodes)
        return
    table = Table("name", "provider", "model", "tools")
    for n in nodes:
        table.add_row(n["name"], n.get("provider_name") or "(none)", n.get("model") or "(provider default)",
                      ", ".join(n.get("tools") or []))
    out.print(table)


@app.command()
@handle_errors
def show(ctx: typer.Context, name: str = NAME, server: str | None = SERVER, token: str | None = TOKEN,
         json_output: bool = JSON) -> None:
    """Show one system node."""
    with connect(ctx, server, token) as client:
        node = without_message(client.get(f"/agent/node/{name}"))
    show_fields(node, ("name", "description", "provider", "provider_name", "model", "tools", "updated_at"), json_output)


@app.command("set")
@handle_errors
def set_node(
    ctx: typer.Context,
    name: str = NAME,
    provider: str | None = typer.Option(None, "--provider", "-p", help="Provider name or provider_id."),
    no_provider: bool = typer.Option(False, "--no-provider", help="Unset the provider."),
    model: str | None = typer.Option(None, "--model", "-m", help="Model id (default: the provider's)."),
    default_model: bool = typer.Option(False, "--default-model", help="Use the provider's model_id."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Set a node's provider and/or model (ADMINISTRATOR and above; its tools are fixed)."""
    if provider is None and model is None and not default_model and not no_provider:
        fail("nothing to change: give --provider, --no-provider, --model or --default-model", ExitCode.USAGE)
    if model is not None and default_model:
        fail("--model and --default-model exclude each other", ExitCode.USAGE)
    if provider is not None and no_provider:
        fail("--provider and --no-provider exclude each other", ExitCode.USAGE)
    body: dict = {}
    if model is not None or default_model:
        body["model"] = model
    if no_provider:
        body["provider"] = None
    with connect(ctx, server, token) as client:
        if provider is not None:
            body["provider"] = resolve_provider(client, provider, ExitCode.NOT_FOUND)
        node = without_message(client.put(f"/agent/node/{name}", json=body))
    if json_output:
        print_json(node)
    success(_described(node))
