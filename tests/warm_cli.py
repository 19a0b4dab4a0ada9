"""`python -m orchestra …` for the tests, started from a warm interpreter.

The CLI tests and every e2e login run the `orchestra` command as a process of its own, as
a user's terminal would, and the e2e tests start hundreds of `orchestra serve` processes.
A fresh interpreter spends 0.6–1.1 s of CPU importing before a command does anything, and
1.2–1.5 s before a server does. Here one process (the
"zygote", one per test process) imports the libraries and orchestra's lower layers once,
then forks a process per command: a real process with its own pid, environment, working
directory, stdin, stdout and stderr, running the command's own entry point
(`orchestra.cli.main`), whose exit status is the command's. Only the imports are shared;
`orchestra.cli` itself is imported in each command's process, since its consoles read the
terminal and COLUMNS when imported.

How a command runs: the test process sends the zygote its arguments, environment and
working directory with four descriptors (stdin, stdout, stderr and a status pipe) over a
socket; the zygote forks a helper that forks the command, reports the command's pid and,
when it ends, its exit code on the status pipe (the zygote itself never waits: it ignores
SIGCHLD, so its helpers are reaped at once).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What every command imports anyway, below the CLI (never orchestra.cli: see above).
PRELOAD = ("httpx", "typer", "click", "rich.console", "rich.table", "peewee", "argon2", "jwt",
           "orchestra.settings", "orchestra.client", "orchestra.core", "orchestra.services.auth",
           "orchestra.services.audit", "orchestra.web.app", "genai_prices.data_snapshot")
MESSAGE_MAX = 1 << 20


# --- the zygote (its own process) -------------------------------------------------------


def serve(fd: int) -> None:
    """The zygote's loop: one fork per request until the test process closes its end."""
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        __import__(name)
    assert "orchestra.cli" not in sys.modules, "a preloaded module imports orchestra.cli"
    assert threading.active_count() == 1, "a preloaded module started a thread: forking is unsafe"
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # helpers are reaped by the kernel
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, MESSAGE_MAX, 4)
        except InterruptedError:
            continue
        if not message:
            return
        if os.fork() == 0:
            sock.close()
            _helper(json.loads(message), fds)
        for descriptor in fds:
            os.close(descriptor)


def _helper(request: dict, fds: list[int]) -> None:
    """Fork the command, report its pid and then its exit code; never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    stdin, stdout, stderr, status = fds
    pid = os.fork()
    if pid == 0:
        os.close(status)
        _command(request, stdin, stdout, stderr)
    for descriptor in (stdin, stdout, stderr):
        os.close(descriptor)
    os.write(status, f"{pid}\n".encode())
    _, waited = os.waitpid(pid, 0)
    os.write(status, f"{os.waitstatus_to_exitcode(waited)}\n".encode())
    os._exit(0)


def _command(request: dict, stdin: int, stdout: int, stderr: int) -> None:
    """In the command's process: its descriptors, environment and directory, then the
    entry point `python -m orchestra` runs; exits with the command's code."""
    for descriptor, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(descriptor, target)
        os.close(descriptor)
    for name in ("SIGINT", "SIGTERM", "SIGPIPE"):  # as a fresh interpreter has them
        signal.signal(getattr(signal, name), signal.default_int_handler if name == "SIGINT"
                      else signal.SIG_DFL if name == "SIGTERM" else signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [str(ROOT / "orchestra" / "__main__.py"), *request["args"]]
    code = 0
    try:
        from orchestra.cli import main

        main()
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, then 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(code)


def _exit_code(value: object) -> int:
    """SystemExit's code as the interpreter turns it into an exit status."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


# --- the test process's side -------------------------------------------------------------


class WarmCLI:
    """This test process's zygote, started at the first command and again if it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None

    def _connection(self) -> socket.socket:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", f"import tests.warm_cli as w; w.serve({theirs.fileno()})"],
                    pass_fds=(theirs.fileno(),), cwd=ROOT, env=env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                theirs.close()
                self._sock = ours
            return self._sock

    def run(self, args: list[str], *, env: dict[str, str], input: str | None = None,
            timeout: float = 60, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """As `subprocess.run([python, "-m", "orchestra", *args], env=env, input=input,
        capture_output=True, text=True, timeout=timeout)` would answer."""
        command = [sys.executable, "-m", "orchestra", *args]
        pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, status
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]
        self._send(args, env, cwd, theirs)
        return _collect(command, pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0], input, timeout)

    def start(self, args: list[str], *, env: dict[str, str], output: int,
              cwd: str | Path | None = None) -> WarmProcess:
        """As `subprocess.Popen([python, "-m", "orchestra", *args], env=env,
        stdout=output, stderr=STDOUT)` (stdin from /dev/null) would start it."""
        status_read, status_write = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        theirs = [stdin, os.dup(output), os.dup(output), status_write]
        self._send(args, env, cwd, theirs)
        return WarmProcess(status_read)

    def _send(self, args: list[str], env: dict[str, str], cwd: str | Path | None,
              theirs: list[int]) -> None:
        """Hand the zygote a command and its four descriptors (closed here once sent)."""
        request = json.dumps({"args": list(args), "env": dict(env), "cwd": str(cwd or os.getcwd())}).encode()
        try:
            try:
                socket.send_fds(self._connection(), [request], theirs)
            except OSError:  # the zygote went away between the check and the send: once more
                with self._lock:
                    if self._proc is not None:
                        self._proc.kill()
                        self._proc.wait()
                socket.send_fds(self._connection(), [request], theirs)
        finally:
            for descriptor in theirs:
                os.close(descriptor)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._sock.close()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def _collect(command: list[str], stdin: int, stdout: int, stderr: int, status: int,
             input: str | None, timeout: float) -> subprocess.CompletedProcess:
    """Feed stdin, read both outputs to their end, and wait for the exit code."""
    out: dict[int, bytes] = {}

    def read(descriptor: int) -> None:
        with os.fdopen(descriptor, "rb") as stream:
            out[descriptor] = stream.read()

    def write() -> None:
        with os.fdopen(stdin, "wb") as stream:
            try:
                if input:
                    stream.write(input.encode())
            except BrokenPipeError:
                pass

    threads = [threading.Thread(target=fn, args=a, daemon=True)
               for fn, a in ((write, ()), (read, (stdout,)), (read, (stderr,)))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    pipe = _StatusPipe(status)
    try:
        pid = pipe.line(deadline)
        code = pipe.line(deadline) if pid is not None else None
        if code is None and pid is not None:  # out of time: kill it, as subprocess.run does
            os.kill(int(pid), signal.SIGKILL)
        for thread in threads:
            thread.join(max(1.0, deadline - time.monotonic()) if code is not None else 5)
    finally:
        pipe.close()
    stdout_text = out.get(stdout, b"").decode(errors="replace")
    stderr_text = out.get(stderr, b"").decode(errors="replace")
    if code is None:
        raise subprocess.TimeoutExpired(command, timeout, output=stdout_text, stderr=stderr_text)
    return subprocess.CompletedProcess(command, int(code), stdout_text, stderr_text)


class _StatusPipe:
    """The lines the helper writes on the status pipe: the command's pid, then its exit code."""

    def __init__(self, descriptor: int) -> None:
        self.descriptor = descriptor
        self._buffer = b""

    def line(self, deadline: float) -> str | None:
        """The next line, or None when the deadline passes (or the pipe ends) first."""
        while b"\n" not in self._buffer:
            left = max(0.0, deadline - time.monotonic())  # 0: only what is there already
            if not select.select([self.descriptor], [], [], left)[0]:
                return None
            chunk = os.read(self.descriptor, 64)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        os.close(self.descriptor)


class WarmProcess:
    """What the tests use of a `subprocess.Popen` (pid, poll, wait, terminate, kill,
    returncode), for a command forked by the zygote: its exit code comes on the status pipe."""

    def __init__(self, status: int) -> None:
        self._status = _StatusPipe(status)
        pid = self._status.line(time.monotonic() + 30)
        if pid is None:
            raise RuntimeError("the warm interpreter did not start the command")
        self.pid = int(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._status.line(time.monotonic() + (timeout if timeout is not None else 10 ** 9))
            if code is None:
                raise subprocess.TimeoutExpired(["orchestra"], timeout)
            self.returncode = int(code)
            self._status.close()
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_warm = WarmCLI()


def run(args: list[str], **options) -> subprocess.CompletedProcess:
    """Run `orchestra *args` in a process forked from this test process's zygote."""
    return _warm.run(args, **options)


def start(args: list[str], **options) -> WarmProcess:
    """Start `orchestra *args` (a server) in a process forked from the zygote."""
    return _warm.start(args, **options)
