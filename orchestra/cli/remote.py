"""What every command that talks to a server shares: `--server`/`--token`/`--json`,
`connect()` (the client filled in from the kept login), and the small printers.

Nothing here imports httpx at module level: the client is loaded when a command runs,
so `orchestra --help` stays quick.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestra.cli.console import ExitCode, fail, out

if TYPE_CHECKING:
    from orchestra.client import Client

SERVER: str | None = typer.Option(
    None, "--server", envvar="ORCHESTRA_SERVER",
    help="Server URL, e.g. http://127.0.0.1:8000 (default: the one you logged in to).")
TOKEN: str | None = typer.Option(
    None, "--token", envvar="ORCHESTRA_TOKEN", help="Access token (default: the one `orchestra login` kept).")
JSON: bool = typer.Option(False, "--json", help="Print JSON (objects as the API returns them, without `message`).")
UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
YES: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")


def kept_path(ctx: typer.Context | None) -> Path:
    """The credentials file under the root `--home` (or $ORCHESTRA_HOME, or ~/.orchestra)."""
    from orchestra.client import credentials_path

    root = (ctx.find_root().obj or {}) if ctx else {}
    return credentials_path(root.get("home"))


def connect(ctx: typer.Context, server: str | None, token: str | None) -> Client:
    """A client for `--server`/`--token`, filled in from the kept credentials."""
    from orchestra.client import Client, load_credentials, normalise_server, save_credentials

    path = kept_path(ctx)
    kept = load_credentials(path)
    if server is None and kept is None:
        fail("no server given: pass --server URL (or set ORCHESTRA_SERVER), or run 'orchestra login'",
             ExitCode.USAGE)
    url = normalise_server(server or kept.server)
    same_server = kept is not None and normalise_server(kept.server) == url
    refresh = None
    if token is None and same_server:
        token, refresh = kept.access_token, kept.refresh_token
    elif token is not None and same_server and token == kept.access_token:
        refresh = kept.refresh_token

    def keep(access: str, refresh_token: str) -> None:
        if same_server:
            kept.access_token, kept.refresh_token = access, refresh_token
            save_credentials(path, kept)

    return Client(url, access_token=token, refresh_token=refresh, on_tokens=keep)


def without_message(body: dict[str, Any]) -> dict[str, Any]:
    """An answer's object without the `message` field."""
    return {k: v for k, v in body.items() if k != "message"}


def show_fields(obj: dict[str, Any], keys: Iterable[str], json_output: bool = False) -> None:
    """`obj` as JSON with `--json`; else `key: value` lines (lists joined by commas,
    objects as JSON), values printed verbatim."""
    if json_output:
        from orchestra.cli.console import print_json

        print_json(obj)
        return
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            shown = ", ".join(value)
        elif isinstance(value, (dict, list)):
            shown = json.dumps(value, ensure_ascii=False)
        else:
            shown = "" if value is None else str(value)
        out.print(f"[b]{key}[/]: ", end="", highlight=False)
        out.print(shown, markup=False, highlight=False)


def confirm(what: str, yes: bool) -> None:
    """Ask before a destructive action unless `--yes`; no terminal to ask → exit 2."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"refusing to {what} without --yes when there is no terminal to confirm", ExitCode.USAGE)
    typer.confirm(f"{what[0].upper()}{what[1:]}?", abort=True)


def read_json_file(file: str) -> Any:
    """The JSON in `file` ('-' reads stdin); a missing or unreadable file or bad JSON is a
    usage error (exit 2)."""
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"no such file: {file}", ExitCode.USAGE)
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}", ExitCode.USAGE)
    try:
        return json.loads(text)
    except ValueError as exc:
        fail(f"{'standard input' if file == '-' else file} is not valid JSON: {exc}", ExitCode.USAGE)


def read_text_arg(value: str) -> str:
    """A text argument, or standard input when it is '-'."""
    return sys.stdin.read().rstrip("\n") if value == "-" else value


def resolve_provider(client: Client, ref: str, missing: ExitCode = ExitCode.USAGE,
                     workspace_id: str | None = None, *, instance_too: bool = False) -> str:
    """The provider_id for `ref`: a provider_id, else a provider's exact name, among
    `workspace_id`'s own providers (None: the instance-wide ones); `instance_too`: among
    the workspace's and then the instance-wide ones, the providers a worker there may use
    (SPEC §16)."""
    if workspace_id is None:
        return resolve_named(client, "/provider", "providers", "provider_id", ref, "provider", missing)
    items = client.get_all("/provider", "providers", params={"workspace_id": workspace_id})
    if instance_too:
        items += client.get_all("/provider", "providers")
    return pick_named(items, "provider_id", ref, "provider", missing)


def resolve_named(client: Client, path: str, key: str, id_field: str, ref: str, what: str,
                  missing: ExitCode = ExitCode.NOT_FOUND, params: dict[str, Any] | None = None) -> str:
    """The id of the item of `GET path` (a list under `key`, with `params`: e.g. one
    workspace's) whose id or exact, case-sensitive name is `ref`; none → one line and
    exit `missing`."""
    return pick_named(client.get_all(path, key, params=params), id_field, ref, what, missing)


def pick_named(items: list[dict[str, Any]], id_field: str, ref: str, what: str,
               missing: ExitCode = ExitCode.NOT_FOUND) -> str:
    """`resolve_named` on items already read (the first of a name wins)."""
    for item in items:
        if ref in (item.get(id_field), item.get("id")):
            return str(item.get(id_field) or item.get("id"))
    named = [item for item in items if item.get("name") == ref]
    if not named and UUID.fullmatch(ref):
        return ref  # maybe not listed to us (an administrator reaching another's): the server decides
    if not named:
        known = ", ".join(sorted(str(i.get("name")) for i in items)) or "none yet"
        fail(f"unknown {what} {ref!r} (no {what} has that id or name; known: {known})", missing)
    return str(named[0].get(id_field) or named[0].get("id"))


def _or_global_workspace(ctx: typer.Context, value: str | None) -> str | None:
    """A command's `--workspace`, else the root's (`orchestra --workspace W …`, which is
    itself `--workspace` over $ORCHESTRA_WORKSPACE): the command's option wins."""
    if value is not None:
        return value
    return ((ctx.find_root().obj or {}) if ctx else {}).get("workspace")


WORKSPACE_HELP = ("A workspace by id or exact name (default: `orchestra --workspace`, else "
                  "$ORCHESTRA_WORKSPACE, else your personal one; lists: all of yours).")
WORKSPACE: str | None = typer.Option(None, "--workspace", callback=_or_global_workspace, help=WORKSPACE_HELP)
UNUSED_WORKSPACE: str | None = typer.Option(
    None, "--workspace",
    help="Taken by every command (as is $ORCHESTRA_WORKSPACE); this one does not use it: what it "
         "acts on is instance-wide, local, or named by its id.")


def own_workspace_option(what: str) -> Any:
    """`--workspace` of the commands on things that are instance-wide or a workspace's own
    (providers, MCP servers; SPEC §16): without one, the instance-wide ones."""
    return typer.Option(
        None, "--workspace", callback=_or_global_workspace,
        help=f"A workspace by id or exact name: its own {what} (you need admin there to change them); default: "
             "`orchestra --workspace`, else $ORCHESTRA_WORKSPACE, else the instance-wide ones (ADMINISTRATOR+ "
             "to change them).")


def own_scope(client: Client, ref: str | None) -> dict[str, str]:
    """The query naming the workspace of `own_workspace_option` (`{}`: the instance-wide ones)."""
    wid = workspace_id(client, ref)
    return {"workspace_id": wid} if wid else {}


def workspace_id(client: Client, ref: str | None) -> str | None:
    """The id of the caller's workspace `ref` (an id or an exact, case-sensitive name;
    None stays None); none → one line and exit 3, two of that name → exit 2."""
    if ref is None or not ref.strip():
        return None
    workspaces = client.get("/workspace").get("workspaces", [])
    for item in workspaces:
        if item.get("workspace_id") == ref:
            return ref
    named = [item for item in workspaces if item.get("name") == ref]
    if not named:
        fail(f"no workspace of yours has the id or name {ref!r} (see 'orchestra workspace list')",
             ExitCode.NOT_FOUND)
    if len(named) > 1:
        fail(f"{len(named)} of your workspaces are named {ref!r}: give its id", ExitCode.USAGE)
    return str(named[0]["workspace_id"])


def workspace_scope(client: Client, ref: str | None) -> dict[str, str]:
    """`{"workspace_id": id}` for a list's query (or a creation's body) when `ref` names
    a workspace, else `{}` (lists: all of yours; creations: your personal one)."""
    wid = workspace_id(client, ref)
    return {"workspace_id": wid} if wid else {}
