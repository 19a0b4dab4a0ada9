"""`orchestra skill …`: shared skills through the server's `/api/v1/resource/skill`.

SKILL arguments take a skill_id or a skill's exact name. Reading is open to every
signed-in user; creating, changing and deleting need ADMINISTRATOR or above.
"""

from __future__ import annotations

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
    read_text_arg,
    resolve_named,
    show_fields,
    without_message,
)

app = typer.Typer(help="Shared skills on a server: list, show, create, update, delete.", no_args_is_help=True)

SKILL = typer.Argument(..., help="A skill_id or a skill's exact name.")
FIELDS = ("skill_id", "name", "description", "instructions", "created_at", "updated_at")
PATH = "/resource/skill"


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="skill")


def _skill_id(client, ref: str) -> str:
    return resolve_named(client, PATH, "skills", "skill_id", ref, "skill")


@app.command("list")
@handle_errors
def list_skills(ctx: typer.Context, server: str | None = SERVER, token: str | None = TOKEN,
                json_output: bool = JSON) -> None:
    """List the skills."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        skills = client.get(PATH).get("skills", [])
    if json_output:
        print_json(skills)
        return
    table = Table("name", "description")
    table.add_column("skill_id", no_wrap=True, min_width=36)
    for s in skills:
        table.add_row(s["name"], s.get("description") or "", s["skill_id"])
    out.print(table)


@app.command()
@handle_errors
def show(ctx: typer.Context, skill: str = SKILL, server: str | None = SERVER, token: str | None = TOKEN,
         json_output: bool = JSON) -> None:
    """Show one skill with its instructions."""
    with connect(ctx, server, token) as client:
        body = without_message(client.get(f"{PATH}/{_skill_id(client, skill)}"))
    show_fields(body, FIELDS, json_output)


@app.command()
@handle_errors
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The skill's name (unique)."),
    description: str = typer.Option("", "--description", "-d", help="What the skill is for."),
    instructions: str = typer.Option("", "--instructions", "-i",
                                     help="Text added to a bound worker's system prompt ('-' reads stdin)."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Create a skill; prints its skill_id."""
    body = {"name": name, "description": description, "instructions": read_text_arg(instructions)}
    with connect(ctx, server, token) as client:
        created = without_message(client.post(PATH, json=body))
    if json_output:
        print_json(created)
    else:
        sys.stdout.write(created["skill_id"] + "\n")
    success(f"created skill {created['name']} ({created['skill_id']})")


@app.command()
@handle_errors
def update(
    ctx: typer.Context,
    skill: str = SKILL,
    name: str | None = typer.Option(None, "--name", help="A new name."),
    description: str | None = typer.Option(None, "--description", "-d", help="A new description."),
    instructions: str | None = typer.Option(None, "--instructions", "-i",
                                               help="New instructions ('-' reads stdin)."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Change a skill's name, description or instructions."""
    body = {k: v for k, v in (("name", name), ("description", description),
                              ("instructions", None if instructions is None else read_text_arg(instructions)))
            if v is not None}
    if not body:
        fail("nothing to change: give --name, --description or --instructions", ExitCode.USAGE)
    with connect(ctx, server, token) as client:
        updated = without_message(client.put(f"{PATH}/{_skill_id(client, skill)}", json=body))
    if json_output:
        print_json(updated)
    success(f"updated skill {updated['name']} ({updated['skill_id']})")


@app.command()
@handle_errors
def delete(ctx: typer.Context, skill: str = SKILL, yes: bool = YES, server: str | None = SERVER,
           token: str | None = TOKEN) -> None:
    """Delete a skill."""
    confirm(f"delete skill {skill}", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"{PATH}/{_skill_id(client, skill)}")
    success(f"deleted skill {skill}")
