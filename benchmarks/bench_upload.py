"""Upload throughput and memory: one 100 MiB file streamed to a real `orchestra serve`.

Each round, in this order and after an `os.sync()` each: `cp` of the source file to the
server's home (same bytes, same file system as `uploads/`), the upload of the same file
with `curl -F file=@source` (a C client: a Python client would compete with the server
for the two cores), and the same upload to a bare Sanic streaming route that only reads
and drops the body (Sanic's own ceiling) and to a blocking socket that only reads and
drops it (the floor of any server: loopback TCP plus curl). Figures are medians of
ROUNDS rounds; the ratio is median upload MiB/s / median cp MiB/s (goal >= 0.5). CPU seconds (server process from
/proc, curl and cp from rusage) say where time goes when the wall clock is noisy. A
thread samples the server's resident memory while files arrive (goal: peak under 64 MiB
above idle). Loopback only, every step bounded by a 300 s timeout.
Run: `python benchmarks/bench_upload.py [MiB] [--rounds N] [--httpx]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json as jsonlib
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from sanic import Request, Sanic
from sanic.response import json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    free_port,
    median,
    orchestra_cli,
    orchestra_server,
    report,
    rss_bytes,
    wait_until_up,
)

MIB = 1024 * 1024
URL = "/api/v1/adapter/client/upload"
BOUNDARY = "orchestra-bench-5b0c2e"
TICK = os.sysconf("SC_CLK_TCK")


def tree_rss(pid: int) -> int:
    """RSS of a process plus its direct children (in case the server forks workers)."""
    total = rss_bytes(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        try:
            total += rss_bytes(int(child))
        except OSError:
            pass
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class PeakSampler(threading.Thread):
    """Polls a process tree's RSS every few milliseconds and keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self.samples += 1
            time.sleep(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


class Timings:
    """Wall seconds, this side's CPU (curl/cp children) and the server's CPU, per round."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.client_cpu: list[float] = []
        self.server_cpu: list[float] = []

    def measure(self, action: Callable[[], object], server_pid: int | None = None) -> object:
        os.sync()  # neither side pays for the other's dirty pages
        cpu0, srv0 = children_cpu(), cpu_seconds(server_pid) if server_pid else 0.0
        started = time.perf_counter()
        result = action()
        self.wall.append(time.perf_counter() - started)
        self.client_cpu.append(children_cpu() - cpu0)
        self.server_cpu.append(cpu_seconds(server_pid) - srv0 if server_pid else 0.0)
        return result

    def rate(self, size_mib: float) -> float:
        return size_mib / median(self.wall)


def curl_upload(base: str, source: Path, token: str | None) -> dict:
    """POST the file as multipart/form-data with curl; the parsed JSON answer."""
    command = ["curl", "-sS", "--fail-with-body", "--max-time", "300", "-H", "Expect:",
               "-F", f"file=@{source};type=application/octet-stream", f"{base}{URL}"]
    if token:
        command[1:1] = ["-H", f"Authorization: Bearer {token}"]
    done = subprocess.run(command, capture_output=True, check=True, timeout=310)
    return jsonlib.loads(done.stdout)


def multipart_parts(path: Path) -> tuple[bytes, bytes]:
    head = (
        f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path.name}\"\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head, f"\r\n--{BOUNDARY}--\r\n".encode()


def multipart_stream(path: Path, chunk: int = MIB):
    """A multipart/form-data body read from disk chunk by chunk (never whole in memory)."""
    head, tail = multipart_parts(path)
    yield head
    with open(path, "rb") as handle:
        while data := handle.read(chunk):
            yield data
    yield tail


def httpx_upload(base: str, source: Path, token: str) -> dict:
    """The same upload from Python (httpx, generator body), for comparison with curl."""
    head, tail = multipart_parts(source)
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
        "Content-Length": str(len(head) + source.stat().st_size + len(tail)),
    }
    answer = httpx.post(f"{base}{URL}", headers=headers, content=multipart_stream(source), timeout=300)
    answer.raise_for_status()
    return answer.json()


def make_source(path: Path, size: int) -> str:
    """Write `size` pseudo-random bytes; return their sha256."""
    digest = hashlib.sha256()
    block = os.urandom(MIB)
    with open(path, "wb") as handle:
        for i in range(size // MIB):
            data = block[i % 7 :] + block[: i % 7]  # cheap variation, not compressible
            digest.update(data)
            handle.write(data)
    return digest.hexdigest()


def run_sink(port: int) -> None:
    """A bare Sanic app whose one streaming route reads and drops the body: Sanic's own
    ceiling for receiving a request body, with nothing parsed, hashed or written."""
    app = Sanic("upload_sink")

    @app.get("/up")
    async def up(request: Request):
        return json({})

    @app.post(URL, stream=True)
    async def sink(request: Request):
        received = 0
        while (chunk := await request.stream.read()) is not None:
            received += len(chunk)
        return json({"received": received}, status=201)

    app.prepare(host="127.0.0.1", port=port, single_process=True, access_log=False, motd=False)
    Sanic.serve_single(primary=app)


def run_raw_sink(port: int) -> None:
    """The floor of any HTTP server here: a blocking socket that `recv_into`s a 1 MiB
    buffer and drops it (no event loop, no copies, no parsing), then answers 201."""
    listener = socket.create_server(("127.0.0.1", port))
    view = memoryview(bytearray(MIB))
    while True:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and (more := conn.recv(65536)):
                head += more
            if b"\r\n\r\n" not in head:
                continue  # a readiness probe
            head, _, rest = head.partition(b"\r\n\r\n")
            lines = [line.split(b":", 1) for line in head.split(b"\r\n")[1:]]
            length = int(dict((k.strip().lower(), v) for k, v in lines).get(b"content-length", 0))
            left = length - len(rest)
            while left > 0 and (got := conn.recv_into(view, min(left, MIB))):
                left -= got
            conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")


def start_sink(kind: str) -> tuple[str, subprocess.Popen]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, kind, str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    if kind == "--sink":
        wait_until_up(f"{base}/up", proc)
    else:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
    return base, proc


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(size_mib: int, rounds: int, with_httpx: bool) -> None:
    size = size_mib * MIB
    with tempfile.TemporaryDirectory(prefix="orchestra-bench-upload-") as tmp:
        tmp_path = Path(tmp)
        home = tmp_path / "home"
        home.mkdir()
        source = tmp_path / "source.bin"
        expected = make_source(source, size)
        sink_base, sink = start_sink("--sink")
        raw_base, raw_sink = start_sink("--raw-sink")
        env = {"ORCHESTRA_UPLOAD_MAX_BYTES": str(size + MIB)}
        cp, up, bare, raw, via_httpx = Timings(), Timings(), Timings(), Timings(), Timings()
        try:
            with orchestra_server(env, home=home) as (base, proc, full_env):
                orchestra_cli(full_env, "user", "create", "bench", "--password-stdin", input="password-123\n")
                login = httpx.post(f"{base}/api/v1/auth/login", json={"user_name": "bench", "password": "password-123"})
                login.raise_for_status()
                token = login.json()["access_token"]
                auth = {"Authorization": f"Bearer {token}"}

                def upload_and_check(send: Callable[[str, Path, str], dict]) -> None:
                    [stored] = up_answer = send(base, source, token)["files"]
                    assert stored["size"] == size and stored["sha256"] == expected, up_answer
                    httpx.delete(f"{base}{URL}/{stored['file_id']}", headers=auth).raise_for_status()

                curl_upload(base, Path(__file__), token)  # warm up
                time.sleep(0.5)
                idle = tree_rss(proc.pid)
                sampler = PeakSampler(proc.pid)
                sampler.start()
                load_before = load_average()
                for _ in range(rounds):
                    target = home / "cp-copy.bin"
                    cp.measure(lambda: subprocess.run(["cp", str(source), str(target)], check=True, timeout=300))
                    target.unlink()
                    # the check and delete run after the timed part: `measure` times the send only
                    answers: list[dict] = []
                    up.measure(lambda: answers.append(curl_upload(base, source, token)), proc.pid)
                    upload_and_check(lambda *_: answers[0])
                    bare.measure(lambda: curl_upload(sink_base, source, None), sink.pid)
                    raw.measure(lambda: curl_upload(raw_base, source, None), raw_sink.pid)
                    if with_httpx:
                        answers.clear()
                        via_httpx.measure(lambda: answers.append(httpx_upload(base, source, token)), proc.pid)
                        upload_and_check(lambda *_: answers[0])
                sampler.stop()
                load_after = load_average()
        finally:
            for helper in (sink, raw_sink):
                helper.terminate()
                helper.wait(timeout=15)

    print(f"one {size_mib} MiB file, {rounds} rounds, medians; load average {load_before} -> {load_after}")
    for name, timings in (("cp (same bytes, same disk)", cp), ("upload (curl -F)", up),
                          ("bare Sanic sink (curl -F)", bare), ("raw socket sink (curl -F)", raw)) + ((("upload (httpx)", via_httpx),) if with_httpx else ()):
        walls = ", ".join(f"{size_mib / w:.0f}" for w in timings.wall)
        report(f"{name} MiB/s", timings.rate(size_mib), f"MiB/s   rounds: {walls}")
    report("ratio upload / cp (medians)", up.rate(size_mib) / cp.rate(size_mib), "", goal=">= 0.5")
    report("ratio upload / bare Sanic sink", up.rate(size_mib) / bare.rate(size_mib), "")
    report("ratio raw socket sink / cp", raw.rate(size_mib) / cp.rate(size_mib), "")
    report("cp CPU seconds", median(cp.client_cpu), "s")
    report("upload: server CPU seconds", median(up.server_cpu), "s")
    report("upload: curl CPU seconds", median(up.client_cpu), "s")
    report("bare sink: server CPU seconds", median(bare.server_cpu), "s")
    report("raw socket sink: CPU seconds", median(raw.server_cpu), "s")
    report("server RSS idle", idle / MIB, "MiB")
    report("server RSS peak during upload", sampler.peak / MIB, "MiB")
    report("peak above idle", (sampler.peak - idle) / MIB, "MiB", goal="< 64")
    print(f"({sampler.samples} RSS samples; sha256 and size verified every round)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sink"]:
        run_sink(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--raw-sink"]:
        run_raw_sink(int(sys.argv[2]))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("mib", nargs="?", type=int, default=100)
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--httpx", action="store_true", help="also time the old httpx client")
        args = parser.parse_args()
        main(args.mib, args.rounds, args.httpx)
