"""A throw-away PostgreSQL cluster that a test may restart and stop (never the shared
server on 5432): initdb and pg_ctl from the machine's PostgreSQL binaries, run as the
`postgres` user on a free port, in a fresh data directory, removed afterwards."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.conftest import free_port


def binaries() -> Path | None:
    """The newest PostgreSQL bin directory holding initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    for pg_ctl in reversed(found):
        bin_dir = Path(pg_ctl).parent
        if (bin_dir / "initdb").exists():
            return bin_dir
    return None


def missing_reason() -> str | None:
    """Why these tests cannot run here, or None."""
    if binaries() is None:
        return "no PostgreSQL binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin"
    if shutil.which("runuser") is None or os.geteuid() != 0:
        return "needs root and runuser to run PostgreSQL as the postgres user"
    return None


class PgCluster:
    """initdb'd on start(); restart(), stop_server()/start_server(); remove() at the end."""

    def __init__(self) -> None:
        self.bin = binaries()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="orchestra-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/orchestra"

    def _as_postgres(self, *args: str, timeout: float = 60) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       capture_output=True, timeout=timeout)

    def start(self) -> PgCluster:
        shutil.chown(self.root, "postgres", "postgres")
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                          "--auth=trust", "--no-sync", "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                       "unix_socket_directories = ''\nfsync = off\nmax_connections = 300\n"
                       "synchronous_commit = off\nfull_page_writes = off\n")
        self.start_server()
        self._as_postgres(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                          "-U", "postgres", "orchestra")
        return self

    def start_server(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                          "-w", "-t", "60", "start")

    def stop_server(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                          "-w", "-t", "60", "stop")

    def restart(self) -> float:
        """`pg_ctl restart -m fast`; its length in seconds."""
        began = time.monotonic()
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                          "-m", "fast", "-w", "-t", "60", "restart")
        return time.monotonic() - began

    def remove(self) -> None:
        with contextlib.suppress(Exception):  # already stopped
            self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                              "-w", "-t", "30", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
