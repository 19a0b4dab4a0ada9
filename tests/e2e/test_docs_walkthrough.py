"""The README's quick start, then examples/README, run as written in one bash shell on a
terminal (a pty), against a real `orchestra serve` and the fake model: the docs are this
test's input, so they cannot drift from what works.

The shell runs in a network namespace of its own (`unshare -rn`), so the docs' fixed
ports (8000 for the server, 9999 for the fake model) are free whatever else runs on this
machine. The password prompt and the question of the human step are answered by typing
at the terminal, as a person would. `. .venv/bin/activate` finds a `.venv` that puts this
test's Python environment first on PATH.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAST_HASH

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "walk\"through\\123"  # a " and a \: the README must not paste it into JSON
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")
DONE = "WALKTHROUGH-ENDED rc="
ANSWERS = ["less sugar", "more detail", "approve", '{"approved": true, "channel": "blog"}']


def shell_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", markdown, flags=re.M | re.S)


def section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start:end if end > 0 else None]


def serve_command() -> str:
    """The README's command that starts the server (its settings included), the last
    command of the first block of "The two commands"."""
    first = shell_blocks(section((ROOT / "README.md").read_text(), "The two commands"))[0]
    return first.strip().split("&&")[-1].strip()


def walkthrough() -> str:
    """The quick start's shell blocks, then examples/README's, one after the other."""
    readme = (ROOT / "README.md").read_text()
    assert serve_command().endswith("orchestra serve")  # what the test starts before the quick start
    quick = shell_blocks(section(readme, "Quick start"))
    examples = shell_blocks((ROOT / "examples" / "README.md").read_text())
    assert len(quick) >= 2 and examples
    return "\n".join(quick + examples)


def namespaces_work() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


class Shell:
    """bash on a pty of 100 x 40; `text` is what it printed, without escape sequences."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        import fcntl
        import struct
        import termios

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
        self.proc = subprocess.Popen(["unshare", "-rn", "bash", "--noprofile", "--norc", "runner.sh"], cwd=folder,
                                     env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        self.raw = b""

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def read_until(self, wanted: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while wanted not in self.text:
            assert time.monotonic() < deadline, f"waited for {wanted!r}:\n{self.text[-4000:]}"
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                assert chunk, f"the shell ended before {wanted!r}:\n{self.text[-4000:]}"
                self.raw += chunk

    def read_until_count(self, wanted: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.text.count(wanted) < count:
            self.read_until(wanted, timeout=max(deadline - time.monotonic(), 0.1))
            if self.text.count(wanted) < count:
                assert time.monotonic() < deadline, f"waited for {wanted!r} x{count}:\n{self.text[-4000:]}"
                self._read(0.2)

    def _read(self, wait: float) -> None:
        ready, _, _ = select.select([self.master], [], [], wait)
        if ready:
            with contextlib.suppress(OSError):
                self.raw += os.read(self.master, 65536)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        # the shell, and whatever it left running (the server, the fake model)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        os.close(self.master)


@pytest.mark.skipif(not namespaces_work(), reason="needs `unshare -rn` (user and network namespaces) "
                    "so that the docs' ports 8000 and 9999 are this test's own")
def test_readme_quick_start_then_examples_readme_as_written(tmp_path):
    folder = tmp_path / "clone"
    folder.mkdir()
    (folder / "examples").symlink_to(ROOT / "examples")
    (folder / ".venv" / "bin").mkdir(parents=True)
    (folder / ".venv" / "bin" / "activate").write_text(
        f'export PATH="{Path(sys.executable).parent}:$PATH"\n')  # this test's environment
    (folder / "walkthrough.sh").write_text(walkthrough())
    (folder / "runner.sh").write_text(f"""
set -e
ip link set lo up
(. .venv/bin/activate && exec env {serve_command()} > server.log 2>&1) &
python3 - <<'EOF'
import socket, time
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", 8000), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
EOF
set +e
bash -e -c '. ./walkthrough.sh; kill $(jobs -p) 2>/dev/null; exit 0'
echo "{DONE}$? (end)"
kill %1
""")
    env = {key: value for key, value in os.environ.items() if not key.startswith("ORCHESTRA_")}
    env.update({"ORCHESTRA_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "TERM": "xterm",
                "COLUMNS": "100", "LINES": "40", "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin",
                **{f"ORCHESTRA_{k.upper()}": str(v) for k, v in FAST_HASH.items()}})
    shell = Shell(folder, env)
    try:
        shell.read_until("Password for admin: ", timeout=90)
        shell.type(PASSWORD + "\r")
        # The questions, in the order the docs ask them: with_human's, then the loop's two
        # rounds (examples/README: answer "more detail", then "approve"), then the review
        # example's approval form (a JSON answer).
        for asked, answer in enumerate(ANSWERS, start=1):
            shell.read_until_count("your answer: ", asked, timeout=240)
            shell.type(answer + "\r")
        shell.read_until(" (end)", timeout=300)
    finally:
        shell.close()
    text = shell.text
    ended = text[text.index(DONE):]
    assert ended.startswith(f"{DONE}0 (end)"), text[-4000:]
    for bad in ("error:", "command not found", "Traceback", "No such file"):
        assert bad not in text, (bad, text[-4000:])
    assert re.search(r'"user_name": ?"alice"', text) and re.search(r'"user_name": ?"admin"', text)  # listed with $TOKEN
    assert text.count("run succeeded in ") >= 4  # three_step, with_human, watch and replay
    assert text.count("no problems") == 3  # orchestra template check of the language examples
    assert "! less sugar" in text  # the answer typed at the prompt was taken
    assert re.search(r'\{"id": 1, "event": "run_started"', text)  # --json | head -3
    assert re.search(r"^\s*\d+ run_finished ", text, flags=re.M)  # follow_run.py
    # examples/README's budget story, as written: it pauses after some topics (not before
    # the first), says what is spent of what, shows no item `running` for a run no process
    # holds, and goes on after the top-up to the end
    story = text[text.index("waiting_budget · cost $"):]
    shown = story[:story.index("budget now $")]
    assert re.match(r"waiting_budget · cost \$0\.00\d+ · budget \$0\.888", shown), shown[:200]
    assert re.search(r"^research\[0\] · succeeded · \$0\.00\d+", shown, flags=re.M), shown[:2000]
    assert re.search(r"^research\[\d\] · pending", shown, flags=re.M), shown[:2000]
    assert not re.search(r"^research.* · running", shown, flags=re.M), shown[:2000]
    assert "budget now $1.388 (spent $0.00" in story and "it is queued again" in story
