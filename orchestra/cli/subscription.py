"""`orchestra subscription …`: other systems told of your runs' events, through
`/api/v1/workflow/subscription` (SPEC §11). The signing secret (`whsec_…`) is printed
once, by `add`, on stdout (the subscription_id goes to stderr then): keep it, it is
never shown again. `--workspace` (or `orchestra --workspace`, or $ORCHESTRA_WORKSPACE)
is where `add` puts the subscription (told of that workspace's runs) and what `list`
lists (SPEC §16).
"""

from __future__ import annotations

import sys

import typer

from orchestra.cli.console import handle_errors, out, print_json, success
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    WORKSPACE,
    YES,
    confirm,
    connect,
    workspace_scope,
)

app = typer.Typer(help="Event subscriptions: add, list, deliveries, retry, remove.", no_args_is_help=True)

PATH = "/workflow/subscription"
SUBSCRIPTION = typer.Argument(..., help="A subscription_id.")
EVENTS = ("run.succeeded", "run.failed", "run.cancelled", "run.waiting_reply")
EVENT_HELP = (f"An event ({', '.join(EVENTS)}), or audit entries of the workspace (audit.*, "
              "audit.<type>.*, audit.<type>.<verb>; admin there); repeat. Default: every run event.")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="subscription")


@app.command()
@handle_errors
def add(
    ctx: typer.Context,
    url: str = typer.Argument(..., help="Where deliveries are POSTed (http:// or https://)."),
    event: list[str] = typer.Option([], "--event", "-e", help=EVENT_HELP),
    template: str | None = typer.Option(None, "--template", help="Only runs of this template (id or exact name)."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Subscribe URL to --workspace's runs (default: your personal one's); prints the
    signing secret (shown this once) on stdout."""
    from orchestra.cli.template import template_id

    with connect(ctx, server, token) as client:
        body = {"url": url, "events": list(event) or list(EVENTS), **workspace_scope(client, workspace)}
        if template is not None:
            body["template_id"] = template_id(client, template, body.get("workspace_id"))
        created = client.post(PATH, json=body)
    if json_output:
        print_json({k: v for k, v in created.items() if k != "message"})
        return
    sys.stdout.write(created["secret"] + "\n")
    success(f"added subscription {created['subscription_id']}; the secret above is shown only now")


@app.command("list")
@handle_errors
def list_subscriptions(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
                       token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List your subscriptions and your workspaces' (--workspace: that one's only; never
    their secrets), each template by its name."""
    from rich.table import Table

    from orchestra.cli.template import template_names

    with connect(ctx, server, token) as client:
        rows = client.get_all(PATH, "subscriptions", params=workspace_scope(client, workspace))
        names = template_names(client) if not json_output and any(r.get("template_id") for r in rows) else {}
    if json_output:
        print_json(rows)
        return
    table = Table("url", "events", "template")
    table.add_column("subscription_id", no_wrap=True, min_width=36)
    for s in rows:
        template = s.get("template_id") or ""
        table.add_row(s["url"], ", ".join(s["events"]), names.get(template, template) if template else "any",
                      s["subscription_id"])
    out.print(table)


def attempts_text(attempts: list[dict]) -> str:
    """One line an attempt: `1. 503` when an answer came, else `2. <why none came>`."""
    return "\n".join(f"{n}. {a['response_code'] or a.get('error') or 'no answer'}"
                     for n, a in enumerate(attempts, 1))


@app.command()
@handle_errors
def deliveries(ctx: typer.Context, subscription: str = SUBSCRIPTION, server: str | None = SERVER,
               token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """A subscription's deliveries, newest first: each attempt's response code, or why
    no answer came (its error)."""
    from rich.table import Table
    from rich.text import Text

    with connect(ctx, server, token) as client:
        rows = client.get(f"{PATH}/{subscription}/deliveries")["deliveries"]
    if json_output:
        print_json(rows)
        return
    table = Table("event", "trace_id", "status", "attempts", "next attempt")
    table.add_column("delivery_id", no_wrap=True, min_width=36)
    for d in rows:
        table.add_row(d["event"], d["trace_id"] or "", d["status"], Text(attempts_text(d["attempts"])),
                      d.get("next_attempt_at") or "", d["delivery_id"])
    out.print(table)


@app.command()
@handle_errors
def retry(ctx: typer.Context, subscription: str = SUBSCRIPTION,
          delivery: str = typer.Argument(..., help="A delivery_id."),
          server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Attempt a delivery again now (the same webhook-id and body)."""
    with connect(ctx, server, token) as client:
        client.post(f"{PATH}/{subscription}/deliveries/{delivery}/retry")
    success(f"delivery {delivery} will be attempted again now")


@app.command()
@handle_errors
def remove(ctx: typer.Context, subscription: str = SUBSCRIPTION, yes: bool = YES, server: str | None = SERVER,
           token: str | None = TOKEN) -> None:
    """Remove a subscription and its deliveries (pending ones are not sent)."""
    confirm(f"remove subscription {subscription}", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"{PATH}/{subscription}")
    success(f"removed subscription {subscription}")
