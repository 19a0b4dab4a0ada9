"""The in-process CLI runner shared by the CLI tests; each module provides its `env`."""

import pytest
from typer.testing import CliRunner

from orchestra.cli import app


@pytest.fixture
def cli(env):
    """`cli("user", "list", "--json")` runs a command in-process with the module's environment."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(app, list(args), input=input, env=env)

    return invoke
