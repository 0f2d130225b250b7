"""Interrupts under `traceml-ci run` with worker DataLoaders are as clean as plain Python: a
Ctrl-C at a terminal (a real pseudo-terminal here) shows the user's own KeyboardInterrupt
traceback once, and a SIGTERM to the whole process group prints nothing but our one line."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.cli.scripts import kill_group, write_script

CLI = [sys.executable, "-m", "traceml_ci", "run"]


def _read_until(
    fd: int, buf: bytearray, done: Callable[[bytearray], bool], timeout: float
) -> bool:
    end = time.monotonic() + timeout
    while not done(buf) and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the terminal's last process closed it
            break
        if not chunk:
            break
        buf += chunk
    return done(buf)


def test_ctrl_c_at_a_terminal_shows_the_users_traceback_once(tmp_path) -> None:
    script = write_script(tmp_path, "workers_forever.py")
    pid, fd = pty.fork()  # the child leads a new session whose terminal is this pty
    if pid == 0:  # pragma: no cover - the child
        try:
            os.chdir(tmp_path)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, [*CLI, "--out", "out", str(script)])
        finally:
            os._exit(127)
    buf = bytearray()
    try:
        assert _read_until(fd, buf, lambda b: b"ready" in b, 120), buf.decode()
        time.sleep(0.3)  # a few steps into the loop
        os.write(fd, b"\x03")  # Ctrl-C: the terminal sends SIGINT to the foreground group
        _read_until(fd, buf, lambda b: b"summary written" in b, 60)
        _, status = os.waitpid(pid, 0)
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        os.close(fd)
    text = buf.decode(errors="replace").replace("\r\n", "\n")
    assert os.waitstatus_to_exitcode(status) == 130, text
    after = text.split("Traceback (most recent call last):\n", 1)
    assert len(after) == 2, text
    assert after[1].startswith(f'  File "{script}"'), text  # the user's frames, not ours
    assert text.count("Traceback") == 1 and "Exception ignored" not in text, text
    assert "\nKeyboardInterrupt\n" in text, text
    doc = json.loads((tmp_path / "out" / "final_summary.json").read_text())
    assert doc["run"]["status"] == "interrupted"
    assert doc["step_time"]["steps_total"] >= 20


def test_group_sigterm_prints_nothing_more_than_python(tmp_path) -> None:
    script = write_script(tmp_path, "workers_forever.py")
    proc = subprocess.Popen(
        [*CLI, "--out", "out", str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        assert proc.stdout.readline().startswith("ready")
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGTERM)  # launcher, child and workers, as a CI runner does
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == 143
    assert err == "traceml-ci: summary written to out/final_summary.json\n"
    doc = json.loads((Path(tmp_path) / "out" / "final_summary.json").read_text())
    assert doc["run"]["status"] == "interrupted"
    assert doc["step_time"]["steps_total"] >= 20
