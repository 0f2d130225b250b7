"""``-o/--output`` of every command that writes a file (diff, combine, report): only a regular
file is ever replaced. A device, pipe or ``/dev/stdout`` is written through; a link keeps being a
link; a directory or an unwritable path is one line and exit 2 (``fsutil.write_output``)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.gate.summaries import DATA
from traceml_ci.cli.main import main

A = DATA / "input_bound_a.json"
REPO = Path(__file__).resolve().parents[2]

#: Each command writing a file, and the start of what it writes.
COMMANDS = {
    "diff": (["diff", str(A), str(A), "--format", "json"], "{"),
    "combine": (["combine", str(A), str(A)], "{"),
    "report": (["report", str(A)], "<!doctype html>"),
}


def _cli(*argv, stdout=subprocess.PIPE, cwd=None, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "traceml_ci", *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_link_to_a_regular_file_is_written_at_its_target_and_stays_a_link(
    tmp_path, capsys, command
):
    argv, start = COMMANDS[command]
    (tmp_path / "site").mkdir()
    target = tmp_path / "site" / "out.txt"
    target.write_text("old")
    link = tmp_path / "out-link"
    link.symlink_to(target)
    assert main([*argv, "-o", str(link)]) == 0
    capsys.readouterr()
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith(start)
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["out.txt"]  # no temp left


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_dev_stdout_is_written_through_a_pipe_not_replaced(command):
    argv, start = COMMANDS[command]
    done = _cli(*argv, "-o", "/dev/stdout")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(start)
    assert "Traceback" not in done.stderr


def test_dev_stdout_redirected_to_a_file_appends_after_the_shell_and_keeps_the_file(tmp_path):
    """``>> log`` (an open descriptor onto a regular file): written through that descriptor, after
    what is there; the file is the same file (same inode), not a replacement."""
    log = tmp_path / "log.txt"
    log.write_text("earlier line\n")
    inode = log.stat().st_ino
    with open(log, "a") as fh:
        done = _cli("diff", str(A), str(A), "--format", "json", "-o", "/dev/stdout", stdout=fh)
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert text.startswith("earlier line\n{") and json.loads(text.split("\n", 1)[1])["verdict"]
    assert log.stat().st_ino == inode


def _null_device(tmp_path: Path) -> str:
    """A null character device to write to. As root, a node of our own (1, 3) in ``tmp_path``:
    a regression would replace that one, not the machine's /dev/null, which the old atomic
    rename did turn into a regular file."""
    if os.geteuid() != 0:
        return os.devnull  # nobody else can replace it
    node = tmp_path / "null-device"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        pytest.skip("root without mknod: would risk the machine's /dev/null")
    return str(node)


def test_a_character_device_is_written_through_and_stays_a_device(tmp_path, capsys):
    """``-o /dev/null`` (also through a link to it): the device is opened and written, never
    replaced."""
    device = _null_device(tmp_path)
    link = tmp_path / "null"
    link.symlink_to(device)
    before = os.stat(device)
    for path in (device, str(link)):
        assert main([*COMMANDS["diff"][0], "-o", path]) == 0
    capsys.readouterr()
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (
        before.st_ino,
        before.st_rdev,
    )
    assert link.is_symlink()


def test_a_named_pipe_is_written_through_to_its_reader(tmp_path, capsys):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        code = main([*COMMANDS["combine"][0], "-o", str(fifo)])
    finally:
        if reader.is_alive():  # unblock the reader whatever happened
            with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
                pass
        reader.join(30)
    capsys.readouterr()
    assert code == 0 and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["repeats"]["count"] == 2


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_directory_or_unwritable_path_is_one_line_exit_2(tmp_path, capsys, command):
    argv, _ = COMMANDS[command]
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    for bad, problem in ((tmp_path, "it is a directory"), (blocked / "out.txt", "cannot write")):
        assert main([*argv, "-o", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"traceml-ci: error: {bad}: "), err
        assert problem in err[0]
    assert blocked.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anything")
def test_a_read_only_file_is_refused_and_kept(tmp_path, capsys):
    target = tmp_path / "out.json"
    target.write_text("keep me")
    target.chmod(0o444)
    assert main([*COMMANDS["diff"][0], "-o", str(target)]) == 2
    assert "read-only" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_dev_stdout_when_stdout_is_closed_is_a_lost_output_141(tmp_path):
    """``-o /dev/stdout >&-``: the report has nowhere to go, as on a closed pipe (141), and it
    lands in no other file that happened to be open on fd 1."""
    argv = " ".join(COMMANDS["diff"][0])
    done = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -m traceml_ci {argv} -o /dev/stdout >&-'],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
    )
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert list(tmp_path.iterdir()) == []
