"""Reading a password for a CLI command: one line of stdin, or a hidden prompt; never argv."""

from __future__ import annotations

import sys

import typer

from orchestra.cli.console import ExitCode, fail


def read_password(password_stdin: bool, *, confirm: bool = True) -> str:
    """A password from stdin (one line) or a hidden prompt; never from argv."""
    if password_stdin:
        line = sys.stdin.readline()
        password = line.rstrip("\r\n")
        if not password:
            fail("no password on standard input", ExitCode.USAGE)
        return password
    if not sys.stdin.isatty():
        fail("no terminal for the password prompt; use --password-stdin", ExitCode.USAGE)
    return typer.prompt("Password", hide_input=True, confirmation_prompt=confirm)
