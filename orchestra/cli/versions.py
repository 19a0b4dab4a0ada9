"""`orchestra template versions | diff | restore` and `orchestra workflow fork` (SPEC §13).

`versions T` lists a template's versions (newest first), `diff T [--from N] [--to M]`
prints what changed by step id, `restore T N` saves version N's content as the newest
version. `workflow fork TRACE --from STEP [--input …] [--set STEP=JSON] [--version N]`
starts a run that reuses the source run's finished work and re-runs STEP and whatever
reads it (or what a changed input or a set output reaches); it prints the new trace_id,
or with `--watch` follows it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from orchestra.cli import template as templates
from orchestra.cli import workflow as workflows
from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import JSON, SERVER, TOKEN, WORKSPACE, connect, workspace_id

PATH = templates.PATH


def register(root: typer.Typer) -> None:
    """Add the commands to the `template` and `workflow` groups."""
    templates.app.command("versions")(handle_errors(versions))
    templates.app.command("diff")(handle_errors(diff))
    templates.app.command("restore")(handle_errors(restore))
    workflows.app.command("fork")(handle_errors(fork))


def _template(client, template: str, workspace: str | None) -> str:
    """The template_id of `template` (a name looked up in `workspace` when one is named)."""
    return templates.template_id(client, template, workspace_id(client, workspace))


def versions(ctx: typer.Context, template: str = templates.TEMPLATE, workspace: str | None = WORKSPACE,
             server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List a template's versions, newest first (every save made one)."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        rows = client.get(f"{PATH}/{_template(client, template, workspace)}/versions")["versions"]
    if json_output:
        print_json(rows)
        return
    table = Table("version", "saved", "author", "steps")
    for row in rows:
        table.add_row(str(row["version"]), row["created_at"], row.get("author_name") or row.get("author_id") or "-", str(row["step_count"]))
    out.print(table)


def diff(ctx: typer.Context, template: str = templates.TEMPLATE,
         from_: int | None = typer.Option(None, "--from", min=1, help="The older version (default: the one before --to)."),
         to: int | None = typer.Option(None, "--to", min=1, help="The newer version (default: the latest)."),
         workspace: str | None = WORKSPACE, server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """What changed between two versions, by step id (+ added, - removed, ~ changed fields)."""
    params = {k: v for k, v in (("from", from_), ("to", to)) if v is not None}
    with connect(ctx, server, token) as client:
        body = client.get(f"{PATH}/{_template(client, template, workspace)}/diff", params=params)
    if json_output:
        print_json({k: v for k, v in body.items() if k != "message"})
        return
    out.print(f"version {body['from']} → {body['to']}", highlight=False, markup=False)
    lines = [f"+ {sid}" for sid in body["added"]] + [f"- {sid}" for sid in body["removed"]]
    lines += [f"~ {c['step_id']}: {', '.join(c['fields'])}" for c in body["changed"]]
    if body["template_fields"]:
        lines.append(f"~ template: {', '.join(body['template_fields'])}")
    for line in lines or ["no changes"]:
        out.print(line, highlight=False, markup=False)


def restore(ctx: typer.Context, template: str = templates.TEMPLATE,
            version: int = typer.Argument(..., min=1, help="The version whose content becomes the newest."),
            workspace: str | None = WORKSPACE, server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Save an earlier version's content as the newest version."""
    with connect(ctx, server, token) as client:
        tid = _template(client, template, workspace)
        body = client.post(f"{PATH}/{tid}/versions/{version}/restore")
    if json_output:
        print_json({k: v for k, v in body.items() if k != "message"})
        return
    success(f"restored version {version} of {body['template']['name']} as version {body['version']}")


def _outputs(pairs: list[str]) -> dict[str, Any]:
    """`STEP=JSON` pairs; a value that is no JSON is taken as text."""
    outputs: dict[str, Any] = {}
    for pair in pairs:
        step, sep, raw = pair.partition("=")
        if not sep or not step:
            fail(f"--set takes STEP=JSON, not {pair!r}", ExitCode.USAGE)
        try:
            outputs[step] = json.loads(raw)
        except ValueError:
            outputs[step] = raw
    return outputs


def fork(ctx: typer.Context, trace_id: str = typer.Argument(..., help="The run to fork (its trace_id)."),
         from_step: str | None = typer.Option(None, "--from", help="Run this step again, and what reads it."),
         input_: str | None = typer.Option(None, "--input", "-i", help="A new input ('-' reads stdin; default: the source's)."),
         input_json: bool = typer.Option(False, "--input-json", "-I", help="Send --input as a JSON value."),
         set_: list[str] = typer.Option([], "--set", help="STEP=JSON: that step's output (repeatable); it is not run."),
         version: int | None = typer.Option(None, "--version", min=1, help="Run on this template version."),
         watch_: bool = typer.Option(False, "--watch", "-w", help="Follow the new run until it ends."),
         server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Start a run that reuses what TRACE finished; prints the new trace_id."""
    body: dict[str, Any] = {"from_step": from_step} if from_step else {}
    if input_ is not None:
        text = sys.stdin.read() if input_ == "-" else input_
        try:
            body["input"] = json.loads(text) if input_json else text
        except ValueError as exc:
            fail(f"--input is not JSON: {exc}", ExitCode.USAGE)
    if set_:
        body["outputs"] = _outputs(set_)
    if version is not None:
        body["version"] = version
    with connect(ctx, server, token) as client:
        new_id = client.post(f"/workflow/run/{trace_id}/fork", json=body)["trace_id"]
        if not watch_:
            if json_output:
                print_json({"trace_id": new_id, "forked_from": trace_id})
            else:
                sys.stdout.write(new_id + "\n")
            return
        workflows._follow(client, new_id, client.events(new_id), json_output)
