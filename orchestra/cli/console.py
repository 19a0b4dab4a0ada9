"""Two consoles (data to stdout, messages to stderr), exit codes, and the one error mapping."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Awaitable, Callable
from enum import IntEnum
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from orchestra.errors import OrchestraError


def store_errors() -> tuple[type[BaseException], ...]:
    """Errors of the store and its drivers (asyncpg only when the postgres extra is there).

    Imported when an error is being mapped, not at start: `orchestra --help` stays quick."""
    import peewee

    errors: list[type[BaseException]] = [peewee.PeeweeException]
    try:
        import asyncpg
    except ImportError:
        return tuple(errors)
    return (*errors, asyncpg.PostgresError, asyncpg.InterfaceError)


def _configuration_error(exc: BaseException) -> bool:
    """A bad rate limit or limiter storage (the `limits` library's own error)."""
    return type(exc).__module__.startswith("limits.") and type(exc).__name__ == "ConfigurationError"

out = Console(soft_wrap=True)
if not out.is_terminal:  # piped output: never cut ids to an imaginary 80 columns
    out.width = max(out.width, 200)
err = Console(stderr=True, soft_wrap=True)


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_FOUND = 3
    CONFLICT = 4
    AUTH = 5
    UNAVAILABLE = 6


_BY_STATUS = {400: ExitCode.USAGE, 401: ExitCode.AUTH, 403: ExitCode.AUTH, 404: ExitCode.NOT_FOUND,
              409: ExitCode.CONFLICT, 413: ExitCode.USAGE, 422: ExitCode.USAGE,
              429: ExitCode.UNAVAILABLE, 502: ExitCode.UNAVAILABLE, 503: ExitCode.UNAVAILABLE}


def exit_code_for(error: OrchestraError) -> ExitCode:
    return _BY_STATUS.get(error.status, ExitCode.ERROR)


JSON_MESSAGES = False  # `orchestra serve` with ORCHESTRA_LOG_FORMAT=json: messages are log records


def say(markup: str, plain: str, *, level: int = 20) -> None:
    """A message to stderr: rich `markup`, or, while JSON_MESSAGES is on, `plain` as one
    log record of `orchestra.cli` (one JSON line)."""
    if JSON_MESSAGES:
        import logging

        logging.getLogger("orchestra.cli").log(level, plain)
    else:
        err.print(markup, highlight=False)


def fail(message: str, code: ExitCode = ExitCode.ERROR) -> typer.Exit:
    """Print one readable line to stderr and exit with `code`."""
    say(f"[bold red]error:[/] {escape(message)}", message, level=40)
    raise typer.Exit(int(code))


def success(message: str) -> None:
    err.print(f"[green]✓[/] {escape(message)}", highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_people(rows: list[dict[str, Any]]) -> None:
    """Users with a role (`user list`, `member list`): name, role and id, the id unwrapped."""
    from rich.table import Table

    table = Table("user_name", "role")
    table.add_column("user_id", no_wrap=True, min_width=36)
    for row in rows:
        table.add_row(row["user_name"], row["role"], row["user_id"])
    out.print(table)


def handle_errors(command: Callable) -> Callable:
    """Decorator: domain errors and bad configuration end as one line and an exit code."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except OrchestraError as exc:
            fail(exc.message, exit_code_for(exc))
        except (ValueError, OSError) as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            fail("interrupted", ExitCode.ERROR)
        except Exception as exc:
            if _configuration_error(exc):
                fail(str(exc))
            if isinstance(exc, store_errors()):
                fail(f"the store could not be used: {exc}", ExitCode.UNAVAILABLE)
            raise

    return wrapper


def run(coro: Awaitable) -> Any:
    import asyncio

    return asyncio.run(coro)
