"""`orchestra provider …`: register, list, show, change, remove and check model providers
through the server's `/api/v1/provider` (kept login, or `--server`/`--token`).

API keys come from a hidden prompt or `--api-key-stdin`, never argv. PROVIDER arguments
take a provider_id or a provider's exact name. Each command takes `--workspace` (or
`orchestra --workspace`, or $ORCHESTRA_WORKSPACE; an id or exact name): that workspace's
own providers (its admins change them, its members read them; SPEC §16); without it, the
instance-wide ones (ADMINISTRATOR and above change them).
"""

from __future__ import annotations

import json
import sys

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    YES,
    confirm,
    connect,
    own_scope,
    own_workspace_option,
    resolve_provider,
    show_fields,
    without_message,
)

app = typer.Typer(help="Model providers on a server: list, show, add, update, remove, check.",
                  no_args_is_help=True)

KINDS_HELP = "openai, deepseek, anthropic, ollama or openai_compatible"
KEYLESS_KINDS = ("ollama", "openai_compatible")
FIELDS = ("provider_id", "name", "provider", "model_id", "base_url", "api_key", "has_api_key", "created_at")
PROVIDER = typer.Argument(..., help="A provider_id or a provider's exact name.")
WORKSPACE: str | None = own_workspace_option("providers")
_where = own_scope


def _find(client, provider: str, where: dict) -> str:
    """The provider_id of PROVIDER among the providers `where` names."""
    return resolve_provider(client, provider, ExitCode.NOT_FOUND, where.get("workspace_id"))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="provider")


def read_api_key(api_key_stdin: bool, no_api_key: bool, kind: str | None) -> str | None:
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


def _check_kind(kind: str) -> None:
    """Refuse an unknown kind before asking for a key (the server says the same)."""
    from orchestra.engine.llm.factory import SUPPORTED_KINDS

    if kind not in SUPPORTED_KINDS:
        fail(f"unsupported provider kind {kind!r}; supported kinds: {', '.join(SUPPORTED_KINDS)}",
             ExitCode.USAGE)


def _summary(view: dict) -> str:
    key = f", key {view['api_key']}" if view.get("api_key") else ""
    return f"{view['name']} ({view['provider']}, {view['model_id']}{key}), provider_id {view['provider_id']}"


@app.command("list")
@handle_errors
def list_providers(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
                   token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List the registered providers (a workspace's, or the instance-wide ones; API keys masked)."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        rows = client.get("/provider", params=_where(client, workspace)).get("providers", [])
    if json_output:
        print_json(rows)
        return
    table = Table("name", "provider", "model_id", "base_url", "api_key")
    table.add_column("provider_id", no_wrap=True, min_width=36)
    for r in rows:
        table.add_row(r["name"], r["provider"], r["model_id"], r.get("base_url") or "", r.get("api_key") or "",
                      r["provider_id"])
    out.print(table)


@app.command()
@handle_errors
def show(ctx: typer.Context, provider: str = PROVIDER, workspace: str | None = WORKSPACE,
         server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Show one provider (its API key masked)."""
    with connect(ctx, server, token) as client:
        where = _where(client, workspace)
        view = without_message(client.get(f"/provider/{_find(client, provider, where)}", params=where))
    show_fields(view, FIELDS, json_output)


@app.command()
@handle_errors
def add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A unique name for the provider."),
    kind: str = typer.Option(..., "--kind", "--provider", "-k", help=f"One of {KINDS_HELP}."),
    model_id: str = typer.Option(..., "--model-id", "-m", help="The default model, e.g. deepseek-chat."),
    base_url: str | None = typer.Option(None, "--base-url", help="API URL (required for openai_compatible)."),
    api_key_stdin: bool = typer.Option(False, "--api-key-stdin", help="Read the API key from standard input."),
    no_api_key: bool = typer.Option(False, "--no-api-key", help="Register without an API key."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Register a provider (instance-wide: ADMINISTRATOR and above; in --workspace: its
    admins); prints its provider_id. The API key is asked for without echo."""
    _check_kind(kind)
    api_key = read_api_key(api_key_stdin, no_api_key, kind)
    body = {"name": name, "provider": kind, "model_id": model_id}
    if api_key is not None:
        body["api_key"] = api_key
    if base_url is not None:
        body["base_url"] = base_url
    with connect(ctx, server, token) as client:
        view = without_message(client.post("/provider", json={**body, **_where(client, workspace)}))
    if json_output:
        print_json(view)
    else:
        sys.stdout.write(f"{view['provider_id']}\n")
    success(f"registered {_summary(view)}")


def _json_options(**options: str | None) -> dict:
    """`--prices`/`--limits`: their JSON values (null removes), by field name."""
    values = {}
    for field, raw in options.items():
        if raw is not None:
            try:
                values[field] = json.loads(raw)
            except ValueError:
                fail(f"--{field} is not JSON: {raw}", ExitCode.USAGE)
    return values


@app.command()
@handle_errors
def update(
    ctx: typer.Context,
    provider: str = PROVIDER,
    name: str | None = typer.Option(None, "--name", help="A new name."),
    model_id: str | None = typer.Option(None, "--model-id", "-m", help="A new default model."),
    base_url: str | None = typer.Option(None, "--base-url", help="A new API URL."),
    no_base_url: bool = typer.Option(False, "--no-base-url", help="Remove the API URL (use the kind's default)."),
    api_key_stdin: bool = typer.Option(False, "--api-key-stdin", help="Read a new API key from standard input."),
    api_key_prompt: bool = typer.Option(False, "--api-key", help="Ask for a new API key (hidden prompt)."),
    no_api_key: bool = typer.Option(False, "--no-api-key", help="Remove the API key."),
    prices: str | None = typer.Option(None, "--prices", help=(
        'Its own prices, USD per million tokens: JSON {"input_per_mtok": "0.27", '
        '"output_per_mtok": "1.1", "cached_input_per_mtok"?}; "null" removes them.')),
    limits: str | None = typer.Option(None, "--limits", help=(
        'JSON {"requests_per_minute"?, "tokens_per_minute"?, "max_concurrency"?}; "null" removes them.')),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Change a provider's name, model, URL, key, prices or limits (instance-wide:
    ADMINISTRATOR and above; in --workspace: its admins); its kind is fixed."""
    if base_url is not None and no_base_url:
        fail("--base-url and --no-base-url exclude each other", ExitCode.USAGE)
    if sum((api_key_stdin, api_key_prompt, no_api_key)) > 1:
        fail("give only one of --api-key, --api-key-stdin and --no-api-key", ExitCode.USAGE)
    body: dict = {}
    if name is not None:
        body["name"] = name
    if model_id is not None:
        body["model_id"] = model_id
    if base_url is not None or no_base_url:
        body["base_url"] = base_url
    if no_api_key:
        body["api_key"] = None
    elif api_key_stdin or api_key_prompt:
        key = read_api_key(api_key_stdin, False, None)
        if key is None:
            fail("no API key given; use --no-api-key to remove the key", ExitCode.USAGE)
        body["api_key"] = key
    body.update(_json_options(prices=prices, limits=limits))
    if not body:
        fail("nothing to change: give --name, --model-id, --base-url, --no-base-url, --api-key, "
             "--api-key-stdin, --no-api-key, --prices or --limits", ExitCode.USAGE)
    with connect(ctx, server, token) as client:
        where = _where(client, workspace)
        view = without_message(client.put(f"/provider/{_find(client, provider, where)}", json=body, params=where))
    if json_output:
        print_json(view)
    success(f"updated {_summary(view)}")


@app.command()
@handle_errors
def remove(
    ctx: typer.Context,
    provider: str = PROVIDER,
    yes: bool = YES,
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN,
) -> None:
    """Remove a provider that no worker or system node uses (instance-wide: ADMINISTRATOR
    and above; in --workspace: its admins)."""
    confirm(f"remove provider {provider}", yes)
    with connect(ctx, server, token) as client:
        where = _where(client, workspace)
        client.delete(f"/provider/{_find(client, provider, where)}", params=where)
    success(f"removed provider {provider}")


@app.command()
@handle_errors
def check(
    ctx: typer.Context,
    provider: str = PROVIDER,
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Ask the provider for its models with the stored key and URL (instance-wide:
    ADMINISTRATOR and above; in --workspace: its admins)."""
    with connect(ctx, server, token) as client:
        where = _where(client, workspace)
        answer = without_message(client.post(f"/provider/{_find(client, provider, where)}/check", params=where))
    models = answer.get("models", [])
    if json_output:
        print_json(answer)
        if not answer.get("ok"):
            raise typer.Exit(int(ExitCode.UNAVAILABLE))
        return
    if not answer.get("ok"):
        fail(answer.get("error") or f"{provider} does not work", ExitCode.UNAVAILABLE)
    for model in models:
        out.print(model, highlight=False, markup=False)
    success(f"{provider} works: {len(models)} model(s) available")
