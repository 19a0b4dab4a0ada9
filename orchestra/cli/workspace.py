"""`orchestra workspace …` and `orchestra member …`: workspaces and their members through
the server's `/api/v1/workspace` (SPEC §16).

`workspace create NAME` prints the new id alone on stdout. Member commands act on the
workspace of `--workspace` (or `ORCHESTRA_WORKSPACE`), by id or exact name; USER is a
user_id or a user name.
"""

from __future__ import annotations

import sys

import typer

from orchestra.cli.console import (
    ExitCode,
    fail,
    handle_errors,
    out,
    print_json,
    print_people,
    success,
)
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    UUID,
    WORKSPACE,
    YES,
    confirm,
    connect,
    workspace_id,
)

app = typer.Typer(help="Your workspaces on a server: create, list, delete.", no_args_is_help=True)
members = typer.Typer(help="The members of a workspace (--workspace): add, list, set, remove.",
                      no_args_is_help=True)

ROLES = "owner, admin, editor, runner, viewer"
ROLE = typer.Option(..., "--role", "-r", help=f"The role in the workspace: {ROLES}.")
USER = typer.Argument(..., help="A user_id or a user name.")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="workspace")
    root.add_typer(members, name="member")


def _required(client, ref: str | None) -> str:
    found = workspace_id(client, ref)
    if found is None:
        fail("name the workspace: --workspace ID_OR_NAME (or set ORCHESTRA_WORKSPACE)", ExitCode.USAGE)
    return found


@app.command()
@handle_errors
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The workspace's name."),
    budget: str | None = typer.Option(None, "--monthly-budget", help="USD its runs may spend a month."),
    on_budget: str | None = typer.Option(None, "--on-budget", help="fail (default) or pause."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Create a team workspace (you are its owner); prints its workspace_id alone."""
    body: dict = {"name": name}
    if budget is not None or on_budget is not None:
        body["limits"] = {k: v for k, v in (("monthly_budget_usd", budget), ("on_budget", on_budget))
                          if v is not None}
    with connect(ctx, server, token) as client:
        created = client.post("/workspace", json=body)
    if json_output:
        print_json({k: v for k, v in created.items() if k != "message"})
        return
    sys.stdout.write(created["workspace_id"] + "\n")
    success(f"created workspace {created['workspace']['name']} ({created['workspace_id']})")


@app.command("list")
@handle_errors
def list_workspaces(
    ctx: typer.Context,
    every: bool = typer.Option(False, "--all", help="Every workspace of the install (SUPER_ADMINISTRATOR)."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """List your workspaces (your personal one first) with your role in each."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        rows = client.get("/workspace", params={"all": "true"} if every else None).get("workspaces", [])
    if json_output:
        print_json(rows)
        return
    table = Table("name", "role", "personal", "monthly budget")
    table.add_column("workspace_id", no_wrap=True, min_width=36)
    for w in rows:
        table.add_row(w["name"], w["role"], "yes" if w["personal"] else "",
                      w["limits"].get("monthly_budget_usd") or "", w["workspace_id"])
    out.print(table)


@app.command()
@handle_errors
def delete(ctx: typer.Context, workspace: str = typer.Argument(..., help="A workspace id or exact name."),
           yes: bool = YES, server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Delete a team workspace and everything in it (owner only)."""
    confirm(f"delete workspace {workspace} and all its templates and runs", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"/workspace/{_required(client, workspace)}")
    success(f"deleted workspace {workspace}")


# --- members -------------------------------------------------------------------------------


def _member_id(client, wid: str, user: str) -> str:
    if UUID.fullmatch(user):
        return user
    for m in client.get(f"/workspace/{wid}/member").get("members", []):
        if m["user_name"].casefold() == user.casefold():
            return m["user_id"]
    fail(f"{user!r} is not a member of this workspace", ExitCode.NOT_FOUND)
    return ""  # unreachable: fail exits


@members.command("add")
@handle_errors
def add(ctx: typer.Context, user: str = USER, role: str = ROLE, workspace: str | None = WORKSPACE,
        server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Add a user to the workspace with a role."""
    body = {"user_id": user} if UUID.fullmatch(user) else {"user_name": user}
    with connect(ctx, server, token) as client:
        made = client.post(f"/workspace/{_required(client, workspace)}/member", json={**body, "role": role})
    if json_output:
        print_json(made["member"])
        return
    success(f"added {made['member']['user_name']} as {made['member']['role']}")


@members.command("list")
@handle_errors
def list_members(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
                 token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List the workspace's members, owners first."""
    with connect(ctx, server, token) as client:
        rows = client.get(f"/workspace/{_required(client, workspace)}/member").get("members", [])
    if json_output:
        print_json(rows)
        return
    print_people(rows)


@members.command("set")
@handle_errors
def set_role(ctx: typer.Context, user: str = USER, role: str = ROLE, workspace: str | None = WORKSPACE,
             server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Change a member's role."""
    with connect(ctx, server, token) as client:
        wid = _required(client, workspace)
        made = client.put(f"/workspace/{wid}/member/{_member_id(client, wid, user)}", json={"role": role})
    success(f"{made['member']['user_name']} is now {made['member']['role']}")


@members.command("remove")
@handle_errors
def remove(ctx: typer.Context, user: str = USER, workspace: str | None = WORKSPACE, yes: bool = YES,
           server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Remove a member (or yourself: leave the workspace)."""
    confirm(f"remove {user} from the workspace", yes)
    with connect(ctx, server, token) as client:
        wid = _required(client, workspace)
        client.delete(f"/workspace/{wid}/member/{_member_id(client, wid, user)}")
    success(f"removed {user}")
