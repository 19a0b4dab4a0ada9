"""Real MCP servers for tests: `fake_mcp`, the SDK-built streamable-HTTP server of
`orchestra.testing.fake_mcp` in a child process on loopback. Import the fixture into a
test module (or conftest) to use it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestra.testing.fake_mcp import FakeMcpProcess

__all__ = ["FakeMcpProcess", "fake_mcp"]


@pytest.fixture
def fake_mcp() -> Iterator[FakeMcpProcess]:
    with FakeMcpProcess() as server:
        yield server
