"""`orchestra provider …`: register, list, remove and check model providers (straight
against the store). API keys come from a hidden prompt or `--api-key-stdin`, never argv."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.table import Table

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, run, success
from orchestra.cli.store import open_core, settings_from
from orchestra.engine.llm.factory import SUPPORTED_KINDS
from orchestra.services import providers as svc

app = typer.Typer(help="Register, list, remove and check model providers.", no_args_is_help=True)

KEYLESS_KINDS = ("ollama", "openai_compatible")


def read_api_key(api_key_stdin: bool, no_api_key: bool, kind: str) -> str | None:
    """The key from stdin (one line) or a hidden prompt; None when there is none."""
    if no_api_key:
        return None
    if api_key_stdin:
        key = sys.stdin.readline().strip()
        if not key:
            fail("no API key on standard input", ExitCode.USAGE)
        return key
    if not sys.stdin.isatty():
        if kind in KEYLESS_KINDS:
            return None
        fail("no terminal for the API key prompt; use --api-key-stdin (or --no-api-key)", ExitCode.USAGE)
    key = typer.prompt("API key (empty for none)", hide_input=True, default="", show_default=False)
    return key.strip() or None


def _row(view: dict) -> dict:
    return {k: view[k] for k in ("provider_id", "name", "provider", "model_id", "base_url", "api_key", "created_at")}


@app.command("list")
@handle_errors
def list_providers(ctx: typer.Context, json_output: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the registered providers (API keys masked)."""

    async def action():
        async with open_core(settings_from(ctx)) as core:
            return [svc.provider_view(p) for p in await svc.list_providers(core)]

    rows = [_row(v) for v in run(action())]
    if json_output:
        print_json(rows)
        return
    table = Table("name", "provider", "model_id", "base_url", "api_key")
    table.add_column("provider_id", no_wrap=True, min_width=36)
    for r in rows:
        table.add_row(r["name"], r["provider"], r["model_id"], r["base_url"] or "", r["api_key"] or "", r["provider_id"])
    out.print(table)


@app.command()
@handle_errors
def add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A unique name for the provider."),
    kind: str = typer.Option(..., "--kind", "--provider", "-k", help=f"One of {', '.join(SUPPORTED_KINDS)}."),
    model_id: str = typer.Option(..., "--model-id", "-m", help="The default model, e.g. deepseek-chat."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="API URL (required for openai_compatible)."),
    api_key_stdin: bool = typer.Option(False, "--api-key-stdin", help="Read the API key from standard input."),
    no_api_key: bool = typer.Option(False, "--no-api-key", help="Register without an API key."),
) -> None:
    """Register a provider; the API key is asked for without echo."""
    svc.clean_kind(kind)  # refuse an unknown kind before asking for a key
    api_key = read_api_key(api_key_stdin, no_api_key, kind)

    async def action():
        async with open_core(settings_from(ctx)) as core:
            provider = await svc.create_provider(
                core, name=name, kind=kind, model_id=model_id, api_key=api_key, base_url=base_url
            )
            return svc.provider_view(provider)

    view = run(action())
    key = f", key {view['api_key']}" if view["api_key"] else ""
    success(f"registered {view['name']} ({view['provider']}, {view['model_id']}{key}), provider_id {view['provider_id']}")


@app.command()
@handle_errors
def remove(
    ctx: typer.Context,
    provider: str = typer.Argument(..., help="Provider name or provider_id."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Remove a provider that no worker or system node uses."""
    if not yes:
        if not sys.stdin.isatty():
            fail("refusing to remove without --yes when there is no terminal to confirm", ExitCode.USAGE)
        typer.confirm(f"Remove provider {provider}?", abort=True)

    async def action():
        async with open_core(settings_from(ctx)) as core:
            found = await svc.find_provider(core, provider)
            return await svc.delete_provider(core, provider_id=found.id)

    removed = run(action())
    success(f"removed provider {removed.name}")


@app.command()
@handle_errors
def check(
    ctx: typer.Context,
    provider: str = typer.Argument(..., help="Provider name or provider_id."),
    json_output: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Ask the provider for its models with the stored key and URL."""

    async def action():
        async with open_core(settings_from(ctx)) as core:
            found = await svc.find_provider(core, provider)
            return found.name, await svc.check_provider(core, provider_id=found.id)

    name, models = run(action())
    if json_output:
        print_json({"ok": True, "models": models})
        return
    for model in models:
        out.print(model, highlight=False)
    success(f"{name} works: {len(models)} model(s) available")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="provider")
