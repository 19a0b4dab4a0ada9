"""Real MCP servers for tests: the `fake_mcp` fixture (tests/conftest.py's) gives a
`FakeMcpView` of the SDK-built streamable-HTTP server of `orchestra.testing.fake_mcp`,
in a child process on loopback; the process it shares is tests/conftest.py's
`_fake_mcp_process`.

Starting that process costs ~0.5-2 s (it imports the MCP SDK and uvicorn), so the
session shares one: each test sees it through a `FakeMcpView`, whose `stats()` counts
only what happened since the test began (or since the test itself restarted it). A test
may still `stop()` it or make it `die`: the next test then gets a new process."""

from __future__ import annotations

from orchestra.testing.fake_mcp import FakeMcpProcess

__all__ = ["FakeMcpProcess", "FakeMcpView"]


class FakeMcpView:
    """One test's view of the session's `FakeMcpProcess`: the same `url`, `start()` and
    `stop()`, and counters that start at zero for this test."""

    def __init__(self, process: FakeMcpProcess) -> None:
        self.process = process
        if process.process is None or process.process.poll() is not None:
            process.start()  # first use, or an earlier test stopped it or made it die
        self._zero = process.stats()

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def base(self) -> str:
        return self.process.base

    @property
    def url(self) -> str:
        return self.process.url

    def stats(self) -> dict[str, int]:
        now = self.process.stats()
        return {key: value - self._zero.get(key, 0) for key, value in now.items()}

    def start(self, timeout: float = 30.0) -> FakeMcpView:
        self.process.start(timeout)
        self._zero = {}  # a new process counts from zero
        return self

    def stop(self) -> None:
        self.process.stop()
