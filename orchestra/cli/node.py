"""`orchestra node …`: list the built-in system nodes and set their provider and model."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, run, success
from orchestra.cli.store import open_core, settings_from
from orchestra.services import agents
from orchestra.services import providers as provider_svc

app = typer.Typer(help="List system nodes and set their provider and model.", no_args_is_help=True)


@app.command("list")
@handle_errors
def list_nodes(ctx: typer.Context, json_output: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the system nodes with their provider, model and fixed tools."""

    async def action():
        async with open_core(settings_from(ctx)) as core:
            return await agents.list_nodes(core)

    nodes = run(action())
    if json_output:
        print_json(nodes)
        return
    table = Table("name", "provider", "model", "tools")
    for n in nodes:
        table.add_row(n["name"], n["provider_name"] or "(none)", n["model"] or "(provider default)", ", ".join(n["tools"]))
    out.print(table)


@app.command("set")
@handle_errors
def set_node(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="planner, reviewer or summarizer."),
    provider: Optional[str] = typer.Option(None, "--provider", "-p", help="Provider name or provider_id."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model id (default: the provider's)."),
    default_model: bool = typer.Option(False, "--default-model", help="Use the provider's model_id."),
) -> None:
    """Set a node's provider and/or model (its tools are fixed)."""
    if provider is None and model is None and not default_model:
        fail("nothing to change: give --provider, --model or --default-model", ExitCode.USAGE)
    if model is not None and default_model:
        fail("--model and --default-model exclude each other", ExitCode.USAGE)
    changes: dict = {}
    if model is not None or default_model:
        changes["model"] = model

    async def action():
        async with open_core(settings_from(ctx)) as core:
            if provider is not None:
                changes["provider"] = (await provider_svc.find_provider(core, provider)).id
            return await agents.update_node(core, name=name, **changes)

    node = run(action())
    success(f"{node['name']}: provider {node['provider_name'] or '(none)'}, model {node['model'] or '(provider default)'}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="node")
