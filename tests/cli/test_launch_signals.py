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


def _wait(pid: int, timeout: float) -> int | None:
    """The wait status of child ``pid``, or None if it has not ended within ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    return None


def _interrupt_in_a_terminal(
    tmp_path: Path, name: str, interrupt: Callable[[int, int], None]
) -> tuple[int, str, Path]:
    """``traceml-ci run`` script ``name`` as the foreground job of a fresh pseudo-terminal,
    ``interrupt(launcher_pid, terminal_fd)`` it a few steps in; returns the exit code, the
    terminal's text and the script."""
    script = write_script(tmp_path, name)
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
        interrupt(pid, fd)
        _read_until(fd, buf, lambda b: b"summary written" in b, 60)
        status = _wait(pid, 30)
        assert status is not None, "the launcher did not end: " + buf.decode(errors="replace")
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
    return os.waitstatus_to_exitcode(status), buf.decode(errors="replace"), script


def _assert_one_user_traceback(tmp_path: Path, code: int, text: str, script: Path) -> None:
    text = text.replace("\r\n", "\n")
    assert code == 130, text
    after = text.split("Traceback (most recent call last):\n", 1)
    assert len(after) == 2, text
    assert after[1].startswith(f'  File "{script}"'), text  # the user's frames, not ours
    assert text.count("Traceback") == 1 and "Exception ignored" not in text, text
    assert "\nKeyboardInterrupt\n" in text, text
    doc = json.loads((tmp_path / "out" / "final_summary.json").read_text())
    assert doc["run"]["status"] == "interrupted"
    assert doc["step_time"]["steps_total"] >= 20


def test_ctrl_c_at_a_terminal_shows_the_users_traceback_once(tmp_path) -> None:
    # Ctrl-C: the terminal sends SIGINT to the whole foreground group; the launcher must not
    # send the child a second one.
    code, text, script = _interrupt_in_a_terminal(
        tmp_path, "workers_forever.py", lambda pid, fd: os.write(fd, b"\x03")
    )
    _assert_one_user_traceback(tmp_path, code, text, script)


def test_sigint_to_the_launcher_alone_reaches_the_child(tmp_path) -> None:
    """In the terminal's foreground too (an IDE's stop button, a supervisor): a SIGINT sent to
    the launcher's pid only is passed on, once. (No worker DataLoader here: workers that did
    not get the SIGINT themselves can print a resource-sharing traceback of their own when
    the main process stops mid-transfer, under plain Python as well.)"""
    code, text, script = _interrupt_in_a_terminal(
        tmp_path, "forever.py", lambda pid, fd: os.kill(pid, signal.SIGINT)
    )
    _assert_one_user_traceback(tmp_path, code, text, script)


def test_group_sigterm_prints_nothing_more_than_python(tmp_path) -> None:
    script = write_script(tmp_path, "workers_forever.py")
    # No progress lines (a run's last one, "... · ended (interrupted)", is ours to print):
    # what is left on stderr is Python's and the summary's line.
    env = {**os.environ, "TRACEML_CI_PROGRESS_INTERVAL": "0"}
    proc = subprocess.Popen(
        [*CLI, "--out", "out", str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
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
