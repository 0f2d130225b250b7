"""``traceml-ci watch``: attaching to a job from another process, following it, its endings
(ended, no job, gone stale, Ctrl-C) and plain lines when stdout is not a terminal."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests.cli.live_snapshots import snapshot, write
from tests.conftest import kill_all, sigint_default
from traceml_ci.cli.main import main
from traceml_ci.cli.watch import follow, gone_for
from traceml_ci.errors import ExitCode, InputError
from traceml_ci.summary.live import STALE_AFTER_S, snapshot_path

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "traceml_ci", "watch"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORCE_COLOR", "TTY_INTERACTIVE", "TTY_COMPATIBLE", "COLUMNS")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- No job there ---------------------------------------------------------------------------

def test_a_folder_without_a_live_folder_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    assert main(["watch", str(tmp_path)]) == ExitCode.BAD_INPUT
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert str(tmp_path / "live") in line and "no traceml-ci job is writing here" in line
    assert out == ""


def test_an_empty_live_folder_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    (tmp_path / "live").mkdir()
    snapshot_path(tmp_path, 0).write_text('{"live_version": "1.0", "rank"')  # torn
    (tmp_path / "live" / "rank1.json").write_bytes(os.urandom(64))
    started = time.monotonic()
    assert main(["watch", str(tmp_path)]) == ExitCode.BAD_INPUT
    assert time.monotonic() - started < 10
    line = _one_line(capsys.readouterr().err)
    assert str(tmp_path / "live") in line and "no readable snapshot" in line


def test_the_default_folder_is_traceml_ci_out_else_traceml_out(tmp_path, monkeypatch,
                                                                capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACEML_CI_OUT", raising=False)
    assert main(["watch"]) == ExitCode.BAD_INPUT
    assert f"traceml-out{os.sep}live" in capsys.readouterr().err
    monkeypatch.setenv("TRACEML_CI_OUT", str(tmp_path / "elsewhere"))
    write(tmp_path / "elsewhere", snapshot(heartbeat=time.time()))
    assert main(["watch", "--once"]) == ExitCode.OK
    assert capsys.readouterr().out.startswith("traceml-ci: step 1200 ")
    assert main(["watch", "--once", "--interval", "0"]) == ExitCode.BAD_INPUT
    assert "--interval '0': must be a finite number of seconds > 0" in capsys.readouterr().err


def test_wait_gives_a_starting_job_time_to_write_its_first_snapshot(tmp_path) -> None:
    now = [1_000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 1_003.0 and not snapshot_path(tmp_path, 0).exists():
            write(tmp_path, snapshot(heartbeat=now[0]))  # the job's first snapshot, at 3 s

    buf = io.StringIO()
    assert follow(tmp_path, console=Console(file=buf), live=False, once=True, wait=5.0,
                  clock=lambda: now[0], sleep=sleep) == ExitCode.OK
    assert buf.getvalue().startswith("traceml-ci: step 1200 ")
    assert 1_003.0 <= now[0] < 1_004.0
    with pytest.raises(InputError, match="no live folder"):  # nothing within the wait
        follow(tmp_path / "other", console=Console(file=buf), live=False, wait=2.0,
               clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] >= 1_005.0


# --- One look -------------------------------------------------------------------------------

def test_once_prints_one_plain_line_beside_garbage_files(tmp_path, capsys) -> None:
    write(tmp_path, snapshot(heartbeat=time.time()))
    snapshot_path(tmp_path, 1).write_text("{")
    snapshot_path(tmp_path, 2).write_bytes(b"\x00" * 300_000)
    assert main(["watch", str(tmp_path), "--once"]) == ExitCode.OK
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "traceml-ci: step 1200 · 14.2 steps/s · dl 47% fwd 31% bwd 18% opt 4% · INPUT_BOUND"]
    assert err == ""


def test_a_fifo_among_the_snapshots_is_skipped_not_waited_on(tmp_path) -> None:
    """rank1.json a named pipe that a writer holds open (reading it would block for ever): the
    other rank's line comes at once, in a real process with a deadline."""
    write(tmp_path, snapshot(heartbeat=time.time()))
    fifo = snapshot_path(tmp_path, 1)
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        done = subprocess.run([*CLI, str(tmp_path), "--once"], capture_output=True, text=True,
                              env=_env(), timeout=60)
    finally:
        os.close(writer)
    assert done.returncode == ExitCode.OK, done.stderr
    assert done.stdout.startswith("traceml-ci: step 1200 ·") and done.stderr == ""


def test_once_on_an_ended_job_says_where_the_summary_is(tmp_path, capsys) -> None:
    write(tmp_path, snapshot(status="completed", summary_path=str(tmp_path / "s.json")))
    assert main(["watch", str(tmp_path), "--once"]) == ExitCode.OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"traceml-ci: run ended (completed); summary: {tmp_path / 's.json'}"


# --- Following, in-process, with a driven clock -------------------------------------------

class Job:
    """A job that advances one snapshot each time watch sleeps: clock and sleep for follow()."""

    def __init__(self, out: Path, beats: int, end: str | None = "completed") -> None:
        self.out, self.beats, self.end = out, beats, end
        self.now = 1_000.0
        self.steps = 100
        self.sleeps: list[float] = []
        write(out, snapshot(heartbeat=self.now, steps_done=self.steps))

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if len(self.sleeps) % 2 or len(self.sleeps) // 2 > self.beats:
            return  # a snapshot every second sleep; none after the last one
        self.steps += 100
        end = self.end if len(self.sleeps) // 2 == self.beats else None
        write(self.out, snapshot(heartbeat=self.now, steps_done=self.steps,
                                 status=end or "running",
                                 summary_path=str(self.out / "final_summary.json")
                                 if end else None))
        # a distinct mtime, even on a filesystem with a coarse clock
        os.utime(snapshot_path(self.out, 0), ns=(len(self.sleeps) * 10**9,) * 2)


def test_the_live_view_follows_the_job_to_its_end(tmp_path) -> None:
    job = Job(tmp_path, beats=4)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100, color_system="truecolor")
    assert follow(tmp_path, console=console, live=True, clock=job.clock,
                  sleep=job.sleep) == ExitCode.OK
    out = buf.getvalue()
    for steps in ("step 100 ", "step 300 ", "step 500 "):
        assert steps in out
    assert "ended: completed" in out
    assert out.rstrip().endswith(
        f"traceml-ci: run ended (completed); summary: {tmp_path / 'final_summary.json'}")
    assert "\x1b[" in out  # a terminal gets the view, not lines
    assert min(job.sleeps) >= 0.25  # at most 4 looks (and paints) a second


def test_plain_lines_every_interval_then_the_end(tmp_path) -> None:
    job = Job(tmp_path, beats=12)
    buf = io.StringIO()
    console = Console(file=buf, width=100)
    assert follow(tmp_path, console=console, live=False, interval=2.0, clock=job.clock,
                  sleep=job.sleep) == ExitCode.OK
    lines = buf.getvalue().splitlines()
    progress = lines[:-1]
    # 12 s of job at one line per 2 s, plus the first and the final line.
    assert 6 <= len(progress) <= 9, lines
    assert progress[0].startswith("traceml-ci: step 100 ")
    assert progress[-1].endswith("ended (completed)")
    assert lines[-1].startswith("traceml-ci: run ended (completed); summary: ")
    assert "\x1b" not in buf.getvalue()


def test_a_job_that_stops_heartbeating_is_flagged_then_given_up(tmp_path) -> None:
    job = Job(tmp_path, beats=2, end=None)  # two snapshots, then silence: hung or killed
    buf = io.StringIO()
    console = Console(file=buf, width=100)
    with pytest.raises(InputError) as err:
        follow(tmp_path, console=console, live=False, interval=1.0, give_up=5.0,
               clock=job.clock, sleep=job.sleep)
    assert "heartbeat" in str(err.value) and "giving up" in str(err.value)
    assert str(tmp_path / "live") in str(err.value)
    lines = buf.getvalue().splitlines()
    assert any("STALE heartbeat: rank 0" in line for line in lines)
    # Gave up between 10 s of stale mark + 5 s of grace past the last beat, and a second more.
    last_beat = 1_000.0 + 2 * 0.5 * 2
    assert STALE_AFTER_S + 5.0 < job.now - last_beat <= STALE_AFTER_S + 5.0 + 1.0


def test_gone_for_counts_from_the_youngest_running_heartbeat() -> None:
    a = snapshot(heartbeat=100.0)
    b = snapshot(heartbeat=90.0, rank=1)
    done = snapshot(heartbeat=0.0, rank=2, status="completed")
    assert gone_for([a, b, done], now=105.0) is None
    assert gone_for([a, b, done], now=100.0 + STALE_AFTER_S + 3) == pytest.approx(3.0)
    assert gone_for([done], now=1e9) is None
    assert gone_for([{"status": "running"}], now=0.0) == float("inf")


def test_a_long_dead_job_is_given_up_at_once_with_exit_2(tmp_path, capsys) -> None:
    write(tmp_path, snapshot(heartbeat=time.time() - 600))
    started = time.monotonic()
    assert main(["watch", str(tmp_path), "--give-up", "5"]) == ExitCode.BAD_INPUT
    assert time.monotonic() - started < 5
    out, err = capsys.readouterr()
    assert "STALE heartbeat: rank 0" in out
    assert "giving up" in _one_line(err)


# --- Real processes -------------------------------------------------------------------------

def test_watch_follows_a_job_in_another_process_to_its_end(tmp_path) -> None:
    """A writer process rewrites its snapshot every 0.1 s; watch (stdout a pipe) attaches, sees
    the step count grow, and exits 0 with the summary path once the writer's last word is in."""
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-m", "tests.cli.live_snapshots", str(tmp_path),
                               str(stop)], cwd=REPO, env=_env())
    watcher = None
    try:
        deadline = time.monotonic() + 60
        while not snapshot_path(tmp_path, 0).exists():
            assert writer.poll() is None and time.monotonic() < deadline, "writer never wrote"
            time.sleep(0.05)
        watcher = subprocess.Popen([*CLI, str(tmp_path), "--interval", "0.2"], cwd=REPO,
                                   env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        seen: list[str] = []
        steps: set[str] = set()
        while len(steps) < 3:
            assert time.monotonic() < deadline, f"watch did not follow: {seen}"
            line = watcher.stdout.readline()
            assert line, f"watch ended early: {seen} {watcher.stderr.read()}"
            seen.append(line)
            steps.add(line.split(" · ")[0])
        stop.touch()
        rest, err = watcher.communicate(timeout=60)
        writer.wait(timeout=30)
    finally:
        kill_all([writer, watcher] if watcher else [writer])
    out = "".join(seen) + rest
    assert watcher.returncode == ExitCode.OK, (out, err)
    assert "\x1b" not in out and err == ""
    counts = [int(line.split(" · ")[0].split()[-1]) for line in out.splitlines()[:-1]]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    summary = json.loads(snapshot_path(tmp_path, 0).read_text())["summary_path"]
    assert out.splitlines()[-1] == f"traceml-ci: run ended (completed); summary: {summary}"


def test_ctrl_c_stops_watching_with_130_and_leaves_the_job_alone(tmp_path) -> None:
    write(tmp_path, snapshot(heartbeat=time.time() + 3600))  # fresh for the whole test
    before = snapshot_path(tmp_path, 0).read_bytes()
    watcher = subprocess.Popen([*CLI, str(tmp_path), "--interval", "0.2"], cwd=REPO,
                               env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=sigint_default)
    try:
        assert watcher.stdout.readline().startswith("traceml-ci: step 1200")
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=30)
    finally:
        kill_all([watcher])
    assert watcher.returncode == ExitCode.INTERRUPTED
    assert "stopped watching" in _one_line(err)
    assert snapshot_path(tmp_path, 0).read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == ["rank0.json"]


def test_on_a_terminal_watch_paints_the_view_and_ends(tmp_path) -> None:
    """Under a pseudo-terminal: the rich view (escape codes, the frame), then the end line."""
    write(tmp_path, snapshot(status="completed", summary_path="out/final_summary.json",
                             heartbeat=time.time()))
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*CLI, str(tmp_path)], cwd=REPO, env=dict(_env(), TERM="xterm"),
                            stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    chunks: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # the child closed its side
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        proc.wait(timeout=30)
    finally:
        kill_all([proc])
        os.close(leader)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == ExitCode.OK, out
    assert "\x1b[" in out and "traceml-ci live" in out and "ended: completed" in out
    assert "traceml-ci: run ended (completed); summary: out/final_summary.json" in out


def test_a_previous_runs_leftover_ranks_are_not_this_runs(tmp_path, capsys) -> None:
    """Yesterday's run had two ranks and ended; today's has one, running, in the same folder."""
    now = time.time()
    old = snapshot(rank=1, world_size=2, heartbeat=now - 86_400, status="completed",
                   summary_path="old.json")
    old["started_at"] = "2026-01-01T00:00:00Z"
    new = snapshot(rank=0, heartbeat=now, steps_done=42)
    new["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60))
    write(tmp_path, old)
    write(tmp_path, new)
    assert main(["watch", str(tmp_path), "--once"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith("traceml-ci: step 42 ") and "2 ranks" not in out and "ended" not in out
    assert gone_for([new, old], now) is None
