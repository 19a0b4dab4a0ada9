"""Upload throughput and memory: one 100 MiB file streamed to a real `orchestra serve`.

Compares the upload's MiB/s with `cp` of the same bytes on the same disk (goal: ratio
>= 0.5) and with a bare Sanic streaming route that only reads and drops the body
(Sanic's own ceiling), and samples the server's resident memory while the file arrives (goal: peak
under 64 MiB above idle, i.e. the file is never held in memory). Loopback only,
three rounds, each bounded by a 300 s timeout. Run: `python benchmarks/bench_upload.py [MiB]`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
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
ROUNDS = 3


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


def multipart_length(path: Path) -> int:
    head, tail = multipart_parts(path)
    return len(head) + path.stat().st_size + len(tail)


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


def sink_times(source: Path, rounds: int) -> list[float]:
    """Seconds to send the same multipart body to the bare sink, per round."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--sink", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/up", proc)
        times = []
        with httpx.Client(base_url=base, timeout=300) as http:
            for _ in range(rounds):
                length = {"Content-Length": str(multipart_length(source))}
                started = time.perf_counter()
                http.post(URL, headers=length, content=multipart_stream(source)).raise_for_status()
                times.append(time.perf_counter() - started)
        return times
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main(size_mib: int = 100) -> None:
    size = size_mib * MIB
    with tempfile.TemporaryDirectory(prefix="orchestra-bench-upload-") as tmp:
        tmp_path = Path(tmp)
        home = tmp_path / "home"
        home.mkdir()
        source = tmp_path / "source.bin"
        expected = make_source(source, size)

        env = {"ORCHESTRA_UPLOAD_MAX_BYTES": str(size + MIB)}
        with orchestra_server(env, home=home) as (base, proc, full_env):
            orchestra_cli(full_env, "user", "create", "bench", "--password-stdin", input="password-123\n")
            with httpx.Client(base_url=base, timeout=300) as http:
                login = http.post("/api/v1/auth/login", json={"user_name": "bench", "password": "password-123"})
                login.raise_for_status()
                headers = {
                    "Authorization": f"Bearer {login.json()['access_token']}",
                    "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
                }
                warm = http.post(URL, headers=headers, content=b"".join(multipart_stream(Path(__file__))))
                warm.raise_for_status()
                time.sleep(0.5)
                idle = tree_rss(proc.pid)

                # Rounds alternate cp (the same bytes on the same disk) and the upload;
                # the best of each is reported, as the machine may be shared.
                sampler = PeakSampler(proc.pid)
                sampler.start()
                cp_times, upload_times = [], []
                for _ in range(ROUNDS):
                    target = home / "cp-copy.bin"
                    os.sync()  # neither side pays for the other's dirty pages
                    started = time.perf_counter()
                    subprocess.run(["cp", str(source), str(target)], check=True)
                    cp_times.append(time.perf_counter() - started)
                    target.unlink()

                    length = {"Content-Length": str(multipart_length(source))}
                    os.sync()
                    started = time.perf_counter()
                    response = http.post(URL, headers={**headers, **length}, content=multipart_stream(source))
                    upload_times.append(time.perf_counter() - started)
                    response.raise_for_status()
                    [stored] = response.json()["files"]
                    assert stored["size"] == size, stored
                    assert stored["sha256"] == expected, "sha256 mismatch"
                    http.delete(f"{URL}/{stored['file_id']}", headers=headers).raise_for_status()
                sampler.stop()

        bare_times = sink_times(source, ROUNDS)
        upload_rate = size_mib / min(upload_times)
        bare_rate = size_mib / min(bare_times)
        cp_rate = size_mib / min(cp_times)
        print(f"upload of one {size_mib} MiB file to a real `orchestra serve` (loopback), "
              f"best of {ROUNDS} rounds")
        report("upload throughput", upload_rate, "MiB/s")
        report("upload throughput, median", size_mib / median(upload_times), "MiB/s")
        report("cp throughput (same bytes, same disk)", cp_rate, "MiB/s")
        report("cp throughput, median", size_mib / median(cp_times), "MiB/s")
        report("ratio upload / cp", upload_rate / cp_rate, "", goal=">= 0.5")
        report("bare Sanic stream sink (reads, drops)", bare_rate, "MiB/s")
        report("ratio upload / bare Sanic sink", upload_rate / bare_rate, "")
        report("server RSS idle", idle / MIB, "MiB")
        report("server RSS peak during upload", sampler.peak / MIB, "MiB")
        report("peak above idle", (sampler.peak - idle) / MIB, "MiB", goal="< 64")
        print(f"({sampler.samples} RSS samples; sha256 verified)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sink"]:
        run_sink(int(sys.argv[2]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
