"""`orchestra file …`: your uploads through the server's `/api/v1/adapter/client/upload`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import JSON, SERVER, TOKEN, YES, confirm, connect

app = typer.Typer(help="Your uploaded files on a server: upload, list, download, delete.", no_args_is_help=True)

UPLOADS = "/adapter/client/upload"
FILE_ID = typer.Argument(..., help="The file's file_id.")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="file")


@app.command()
@handle_errors
def upload(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(..., help="One or more files to upload."),
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Upload files (one request); prints each new file_id on its own line."""
    for path in paths:
        if not path.is_file():
            fail(f"no such file: {path}", ExitCode.USAGE)
    with connect(ctx, server, token) as client:
        files = client.upload(paths)
    if json_output:
        print_json(files)
    else:
        sys.stdout.write("".join(f"{f['file_id']}\n" for f in files))
    for f in files:
        success(f"uploaded {f['filename']} ({f['size']} bytes), file_id {f['file_id']}")


@app.command("list")
@handle_errors
def list_files(ctx: typer.Context, server: str | None = SERVER, token: str | None = TOKEN,
               json_output: bool = JSON) -> None:
    """List your files, oldest first."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        files = client.get_all(UPLOADS, "files")
    if json_output:
        print_json(files)
        return
    table = Table("filename", "size", "content_type", "created_at")
    table.add_column("file_id", no_wrap=True, min_width=36)
    for f in files:
        table.add_row(f["filename"], str(f["size"]), f.get("content_type") or "", f.get("created_at") or "",
                      f["file_id"])
    out.print(table)


@app.command()
@handle_errors
def download(
    ctx: typer.Context,
    file_id: str = FILE_ID,
    output: str | None = typer.Option(
        None, "--output", "-o",
        help="Where to write: a file, an existing folder (the upload's name inside it), or '-' for "
             "stdout. Default: the upload's name in the current folder."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
    server: str | None = SERVER, token: str | None = TOKEN,
) -> None:
    """Download one of your files."""
    written: list[Path] = []

    def open_target(filename: str):
        if output == "-":
            return os.fdopen(os.dup(sys.stdout.fileno()), "wb")
        target = Path(output) if output else Path(filename)
        if target.is_dir():
            target = target / filename
        if target.exists() and not force:
            fail(f"{target} exists; pass --force to overwrite it", ExitCode.USAGE)
        written.append(target)
        return target.open("wb")

    with connect(ctx, server, token) as client:
        try:
            name, size = client.download(file_id, open_target)
        except BaseException:
            for path in written:  # no half-written file is left behind
                path.unlink(missing_ok=True)
            raise
    where = "standard output" if output == "-" else str(written[0])
    success(f"downloaded {name} ({size} bytes) to {where}")


@app.command()
@handle_errors
def delete(ctx: typer.Context, file_id: str = FILE_ID, yes: bool = YES, server: str | None = SERVER,
           token: str | None = TOKEN) -> None:
    """Delete one of your files."""
    confirm(f"delete file {file_id}", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"{UPLOADS}/{file_id}")
    success(f"deleted file {file_id}")
