"""`orchestra template …`: workflow templates through the server's `/api/v1/workflow/template`.

TEMPLATE arguments take a template_id or the exact name of a template you can see.
`create` and `update` read JSON (`{name, description?, steps, shared?}`) from a file or
stdin ('-'); `update` sends the template's current fields overlaid with the file's, so a
file holding only `{"steps": […]}` changes only the steps. `check` asks the server to run
every save-time check (`POST /template/check`: the one validator, which alone knows your
workers) and prints each problem with its path, saving nothing.
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
    YES,
    confirm,
    connect,
    read_json_file,
    resolve_named,
    show_fields,
    workspace_id,
)

app = typer.Typer(help="Workflow templates on a server: list, show, check, create, update, delete, versions, diff, restore.",
                  no_args_is_help=True)

PATH = "/workflow/template"
TEMPLATE = typer.Argument(..., help="A template_id or a template's exact name.")
FILE = typer.Argument(..., help="Template JSON file ({name, description?, steps, shared?}); '-' reads stdin.")
SHARED = typer.Option(None, "--shared/--private",
                      help="Readable and runnable by every user (ADMINISTRATOR and above), or only yours.")
EDITABLE = ("name", "description", "steps", "shared", "input_schema", "limits", "output")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="template")


def template_id(client, ref: str, in_workspace: str | None = None) -> str:
    """The template_id `ref` names: an id-looking `ref` is sent as it is (the server
    decides, and a key needs no `template:read` for it); a name is looked up in the
    templates list (`in_workspace`, a workspace_id: that workspace's), which an API key
    may read only with `template:read`."""
    from orchestra.cli.remote import UUID
    from orchestra.client import APIError

    if UUID.fullmatch(ref):
        return ref
    try:
        return resolve_named(client, PATH, "templates", "template_id", ref, "template",
                             params={"workspace_id": in_workspace} if in_workspace else None)
    except APIError as exc:
        if exc.status == 403 and "template:read" in exc.message:
            fail(f"{ref!r} is a template name, and finding a template by name needs the scope "
                 "'template:read', which this API key lacks: pass the template's template_id "
                 "instead, or use a key with template:read", ExitCode.AUTH)
        raise


def template_names(client) -> dict[str, str]:
    """{template_id: name} of the templates the caller may read; {} when it may not list
    them (an API key without template:read): lists then show ids."""
    from orchestra.client import APIError

    try:
        return {str(t.get("template_id")): str(t.get("name")) for t in client.get_all(PATH, "templates")}
    except APIError as exc:
        if exc.status == 403:
            return {}
        raise


def _object(body: Any, file: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        fail(f"{file} must hold a JSON object {{name, description?, steps, shared?}}", ExitCode.USAGE)
    return body


def create_from_file(ctx: typer.Context, file: str, shared: bool | None, server: str | None,
                     token: str | None, json_output: bool, workspace: str | None = None) -> None:
    """Create a template from a JSON file; the template_id alone on stdout (or the answer as JSON)."""
    body = _object(read_json_file(file), file)
    if shared is not None:
        body["shared"] = shared
    with connect(ctx, server, token) as client:
        if workspace:
            body["workspace_id"] = workspace_id(client, workspace)
        created = client.post(PATH, json=body)
    if json_output:
        print_json({k: v for k, v in created.items() if k != "message"})
        return
    sys.stdout.write(created["template_id"] + "\n")
    success(f"created template {created['template']['name']} ({created['template_id']})")


@app.command("list")
@handle_errors
def list_templates(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
                   token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List your templates, the shared ones and your workspaces', oldest first."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        templates = client.get_all(PATH, "templates", params={"workspace_id": wid} if wid else None)
    if json_output:
        print_json(templates)
        return
    table = Table("name", "steps", "shared", "description")
    table.add_column("template_id", no_wrap=True, min_width=36)
    for t in templates:
        table.add_row(t["name"], str(len(t.get("steps") or [])), "yes" if t.get("shared") else "",
                      t.get("description") or "", t["template_id"])
    out.print(table)


@app.command()
@handle_errors
def show(ctx: typer.Context, template: str = TEMPLATE, workspace: str | None = WORKSPACE,
         server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Show a template and its steps (a name is looked up in --workspace when given)."""
    with connect(ctx, server, token) as client:
        body = client.get(f"{PATH}/{template_id(client, template, workspace_id(client, workspace))}")["template"]
        if json_output:
            print_json(body)
            return
        names = {w.get("worker_id"): w.get("name") for w in client.get_all("/agent/worker", "workers")}
    show_fields(body, ("template_id", "name", "description", "shared", "owner_id", "created_at", "updated_at"))
    out.print("[b]steps[/]:", highlight=False)
    for step in body.get("steps") or []:
        agent = ", ".join(f"{k}={names.get(v, v) if k == 'worker' else v}"  # a worker by its name
                          for k, v in (step.get("agent") or {}).items())
        after = f" after {', '.join(step['depends_on'])}" if step.get("depends_on") else ""
        out.print(f"  {step['id']} ({agent}){after}: ", end="", highlight=False, markup=False)
        out.print(step.get("prompt", ""), highlight=False, markup=False)


@app.command()
@handle_errors
def create(ctx: typer.Context, file: str = FILE, shared: bool | None = SHARED,
           workspace: str | None = WORKSPACE,
           server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Create a template from JSON (in --workspace; default your personal one); prints its template_id."""
    create_from_file(ctx, file, shared, server, token, json_output, workspace)


@app.command()
@handle_errors
def update(ctx: typer.Context, template: str = TEMPLATE, file: str = FILE, shared: bool | None = SHARED,
           workspace: str | None = WORKSPACE,
           server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Change a template: its current fields overlaid with those in the JSON file (a name
    is looked up in --workspace when given)."""
    changes = _object(read_json_file(file), file)
    if shared is not None:
        changes["shared"] = shared
    with connect(ctx, server, token) as client:
        tid = template_id(client, template, workspace_id(client, workspace))
        current = client.get(f"{PATH}/{tid}")["template"]
        body = {**{k: current[k] for k in EDITABLE if k in current}, **changes}
        updated = client.put(f"{PATH}/{tid}", json=body)
    if json_output:
        print_json(updated["template"])
    success(f"updated template {updated['template']['name']} ({tid})")


@app.command()
@handle_errors
def delete(ctx: typer.Context, template: str = TEMPLATE, yes: bool = YES, workspace: str | None = WORKSPACE,
           server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Delete a template (runs keep their own copy of the steps; a name is looked up in
    --workspace when given)."""
    confirm(f"delete template {template}", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"{PATH}/{template_id(client, template, workspace_id(client, workspace))}")
    success(f"deleted template {template}")


@app.command()
@handle_errors
def check(ctx: typer.Context, file: str = FILE, server: str | None = SERVER,
          token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Check a template file without saving it: every problem with its path (exit 2 if any)."""
    from orchestra.client import APIError

    body = _object(read_json_file(file), file)
    body.setdefault("name", "check")  # a name is not what is being checked
    with connect(ctx, server, token) as client:
        try:
            answer = client.post(f"{PATH}/check", json=body)
            problems = answer.get("problems") or []
        except APIError as exc:  # a body the route itself refused (a wrong type): same shape
            if exc.status != 422 or not isinstance(exc.detail, list):
                raise
            problems = exc.detail
    if json_output:
        print_json({"valid": not problems, "problems": problems})
    else:
        for problem in problems:
            out.print(f"{problem.get('field', '')}: {problem.get('problem', '')}", highlight=False, markup=False)
    if problems:
        raise fail(f"{file}: {len(problems)} problem{'s' if len(problems) != 1 else ''}", ExitCode.USAGE)
    success(f"{file}: no problems")
