"""`traceml-ci run`'s terminal handling for real: the launcher on a pseudo-terminal (as a user's
shell runs it), the script on one of its own, the live view painted under its output; plain
progress lines in a pipe; Ctrl-C (once, twice) and SIGTERM endings.

The scripts here need no torch (they start fast); they write live snapshots themselves with
``snapshot_from_summary``, as the tracer's writer thread does.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyte

from tests.cli.scripts import run_group
from traceml_ci.cli.live_run import _at_rest
from traceml_ci.fsutil import atomic_write_text
from traceml_ci.summary.live import snapshot_from_summary, snapshot_path

CLI = [sys.executable, "-m", "traceml_ci", "run"]
ROWS, COLS = 30, 100

#: Writes a snapshot every 5 steps, prints a line a step; argv: out, steps, seconds a step.
SNAPSHOTS = '''
import json, os, sys, time
from traceml_ci.fsutil import atomic_write_text
from traceml_ci.summary.live import snapshot_from_summary, snapshot_path

out, steps, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
size = os.get_terminal_size(1) if os.isatty(1) else None
print("ready", os.getpid(), os.isatty(0), os.isatty(1), os.isatty(2), size, flush=True)
started = time.time()
for step in range(1, steps + 1):
    time.sleep(pause)
    print(f"line {step}", flush=True)
    if step % 5:
        continue
    window = {"step_time": {"steps_analyzed": step, "dataloader_pct": 40.0, "forward_pct": 30.0,
                            "backward_pct": 20.0, "optimizer_pct": 10.0,
                            "step_ms": {"median": 5.0, "p90": 6.0}, "clock": "host"},
              "diagnoses": [{"area": "step_time", "kind": "INPUT_BOUND", "message": "m",
                             "next_step": "n"}]}
    identity = {"run_name": "live-demo", "rank": 0, "local_rank": 0, "world_size": 1,
                "host": "h", "pid": os.getpid(), "started_at": started}
    snap = snapshot_from_summary(window, steps_done=step, steps_per_s=1 / pause,
                                 history_ms=[5.0] * 3, first_window_pct=None, memory={},
                                 identity=identity, heartbeat=time.time())
    atomic_write_text(snapshot_path(out, 0), json.dumps(snap))
'''

#: 10,000 lines as fast as it can, stdout and stderr in turn, numbered, and a coloured one.
FLOOD = '''
import sys
print("isatty", sys.stdout.isatty(), sys.stderr.isatty(), sys.stdin.isatty(), flush=True)
print("\\x1b[31mred\\x1b[0m \\u00e9t\\u00e9", flush=True)
for i in range(5000):
    print(f"o{2 * i}")
    print(f"e{2 * i + 1}", file=sys.stderr)
sys.stdout.flush()
print("end", flush=True)
'''

#: Ignores the first Ctrl-C (says so) and goes on; argv: out.
STUBBORN = '''
import os, time
ready = False
while True:
    try:
        if not ready:  # inside the try: a Ctrl-C right after it is caught too
            ready = print("ready", os.getpid(), flush=True) or True
        time.sleep(0.05)
    except KeyboardInterrupt:
        print("caught one", flush=True)
'''

#: Loops until interrupted.
FOREVER = '''
import os, time
print("ready", os.getpid(), flush=True)
while True:
    time.sleep(0.05)
'''


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


class Terminal:
    """``traceml-ci run ARGS`` as the foreground job of a fresh ROWS x COLS pseudo-terminal;
    ``in_process(args)``, if given, runs the launcher in the forked process instead of a
    fresh interpreter (to change what it renders)."""

    def __init__(self, tmp_path: Path, args: list[str],
                 in_process: Callable[[list[str]], int] | None = None,
                 stdin_null: bool = False) -> None:
        self.buf = bytearray()
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # pragma: no cover - the child
            code = 127
            try:
                os.chdir(tmp_path)
                termios.tcsetwinsize(0, (ROWS, COLS))
                if stdin_null:
                    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                if in_process is None:
                    os.execv(sys.executable, [*CLI, *args])
                # The terminal's streams, not pytest's capture, as in a fresh interpreter.
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                code = in_process(args)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.status: int | None = None

    def read_until(self, done: Callable[[bytes], bool], timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not done(bytes(self.buf)) and time.monotonic() < end:
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the launcher ended and closed the terminal
                break
            if not chunk:
                break
            self.buf += chunk
        return done(bytes(self.buf))

    def wait(self, timeout: float = 60) -> int:
        """The launcher's exit code, reading its output meanwhile (it must never block)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.read_until(lambda b: False, 0.2)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = status
                self.read_until(lambda b: False, 0.3)
                return os.waitstatus_to_exitcode(status)
        raise AssertionError("the launcher did not end: " + self.text)

    @property
    def text(self) -> str:
        return self.buf.decode(errors="replace")

    def close(self, *pids: int) -> None:
        """Kill whatever is left: the launcher's session and the script's."""
        for pid in (self.pid, *pids):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.status is None:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        os.close(self.fd)


@contextmanager
def _started(tmp_path: Path, args: list[str],
             in_process: Callable[[list[str]], int] | None = None,
             stdin_null: bool = False) -> Iterator[tuple[Terminal, int]]:
    """``traceml-ci run args`` on a terminal, once its script said ready (its pid); the terminal
    closed, and the script killed if it is still there, however the block ends."""
    term = Terminal(tmp_path, args, in_process, stdin_null)
    pid = 0
    try:
        pid = _ready_pid(term)
        yield term, pid
    finally:
        term.close(pid)


def _ready_pid(term: Terminal) -> int:
    assert term.read_until(lambda b: re.search(rb"ready (\d+)", b) is not None, 60), term.text
    return int(re.search(rb"ready (\d+)", bytes(term.buf)).group(1))


#: What the view writes among the script's bytes: a painted frame (saved cursor ... restored
#: cursor) and the linefeeds that make room for it.
_PAINT = re.compile(rb"\x1b7.*?\x1b8", re.S)
_ROOM = re.compile(rb"(\n+)\x1b\[(\d+)A")


def _unroom(m: re.Match[bytes]) -> bytes:
    """Making room is N linefeeds then N rows up: drop exactly those, not a linefeed of the
    script's that came just before them."""
    feeds, up = m.group(1), int(m.group(2))
    return feeds[:-up] if up <= len(feeds) else m.group(0)


def _script_bytes(raw: bytes) -> bytes:
    return _ROOM.sub(_unroom, _PAINT.sub(b"", raw))


def _old_run(tmp_path: Path) -> None:
    """A previous run's last snapshot in the same folder (an hour ago): not this run's view."""
    old = snapshot_from_summary({}, steps_done=7777777, steps_per_s=1.0, history_ms=[],
                                first_window_pct=None, memory={}, identity={"rank": 0},
                                status="completed", heartbeat=time.time() - 3600)
    atomic_write_text(snapshot_path(tmp_path / "out", 0), json.dumps(old))


def _summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "final_summary.json").read_text())


def test_output_arrives_complete_and_in_order_and_the_script_sees_a_terminal(tmp_path) -> None:
    script = _script(tmp_path, "flood.py", FLOOD)
    term = Terminal(tmp_path, ["--out", "out", str(script)])
    try:
        code = term.wait(120)
    finally:
        term.close()
    assert code == 0, term.text
    mine = _script_bytes(bytes(term.buf))
    expected = b"".join(
        f"{'o' if i % 2 == 0 else 'e'}{i}\r\n".encode() for i in range(10_000)
    )
    assert b"isatty True True True\r\n" in mine  # stdin too: our keystrokes reach it
    assert "\x1b[31mred\x1b[0m été\r\n".encode() in mine  # colours and UTF-8 untouched
    assert expected + b"end\r\n" in mine, mine[-2000:]  # every line, in order, nothing inside


def test_the_view_is_painted_under_the_output_and_the_last_frame_stays(tmp_path) -> None:
    script = _script(tmp_path, "snaps.py", SNAPSHOTS)
    _old_run(tmp_path)
    with _started(tmp_path, ["--out", "out", str(script), "out", "40", "0.05"]) as (term, pid):
        code = term.wait(60)
    assert code == 0, term.text
    raw = bytes(term.buf)
    # The script was told the terminal is shorter by the view's rows...
    size = re.search(rb"ready \d+ True True True os.terminal_size\(columns=(\d+), lines=(\d+)\)",
                     raw)
    assert size is not None, term.text
    cols = int(size.group(1))
    assert cols == COLS
    # ...and its text scrolls in the rows above the view (the scroll region), which the view
    # took once it had a frame (on a loaded machine maybe after the script asked its size).
    regions = [int(n) for n in re.findall(rb"\x1b\[1;(\d+)r", raw)]
    assert regions and min(regions) < ROWS, regions
    lines = min(regions)
    # Frames painted while it ran, in the bottom rows, changing as the snapshots came (the
    # frame's layout is render_frame's: only what any frame shows is checked here).
    frames = [f for f in _PAINT.findall(raw) if f"\x1b[{lines + 1};1H".encode() in f]
    assert len(set(frames)) >= 3, frames[-3:]
    assert any(b"steps/s" in f for f in frames)
    assert b"7777777" not in raw and b"7,777,777" not in raw  # not the old run's
    # The script's own lines, all there and in order.
    mine = _script_bytes(raw)
    assert b"".join(f"line {i}\r\n".encode() for i in range(1, 41)) in mine
    # The end: the scroll region reset, the last frame printed inline after the script's
    # last line, then the summary's path.
    tail = raw[raw.rindex(b"line 40"):]  # (a frame may be painted between it and its \r\n)
    end = re.search(
        rb"\x1b\[r.*?\x1b\[\?25h(.+)\r\ntraceml-ci: summary out/final_summary.json", tail, re.S
    )
    assert end is not None and b"steps/s" in end.group(1), tail
    assert _summary(tmp_path)["run"]["status"] == "completed"


def _growing_view(args: list[str]) -> int:  # pragma: no cover - runs in the forked child
    """The launcher with a frame that grows a row every 10 steps (as a multi-rank view can)."""
    from rich.text import Text

    from traceml_ci.cli import live_view
    from traceml_ci.cli.main import main

    def frame(snapshots, *, now, width=100, height=None):
        steps = snapshots[0]["steps_done"] if snapshots else 0
        rows = 1 + steps // 10
        return Text("\n".join(f"view {k + 1}/{rows} at step {steps}" for k in range(rows)))

    live_view.render_frame = frame
    return main(["run", *args])


def _broken_view(args: list[str]) -> int:  # pragma: no cover - runs in the forked child
    """The launcher with a view that fails once the job has snapshots."""
    from traceml_ci.cli import live_view
    from traceml_ci.cli.main import main

    def frame(snapshots, *, now, width=100, height=None):
        if snapshots:
            raise RuntimeError("no frame today")
        return "waiting"

    live_view.render_frame = frame
    return main(["run", *args])


def test_a_failing_view_turns_itself_off_and_the_script_goes_through(tmp_path) -> None:
    script = _script(tmp_path, "snaps.py", SNAPSHOTS + "raise SystemExit(3)\n")
    with _started(tmp_path, ["--out", "out", str(script), "out", "30", "0.03"],
                  _broken_view) as (term, pid):
        code = term.wait(60)
    assert code == 3, term.text  # the script's own exit code
    mine = _script_bytes(bytes(term.buf))
    assert b"".join(f"line {i}\r\n".encode() for i in range(1, 31)) in mine
    assert term.text.count("traceml-ci: warning: live view off (RuntimeError: no frame today)") == 1
    assert term.buf.count(b"\x1b[r") >= 2  # the region given back at once, and at the end


def _screen_rows(screen: pyte.Screen) -> list[str]:
    return [line.rstrip() for line in screen.display]


def test_on_screen_the_script_scrolls_above_the_view_and_nothing_is_covered(tmp_path) -> None:
    """What a user sees, through a terminal emulator: while the script runs, its latest lines
    fill the rows above the view, consecutive (none painted over, even as the view grows);
    at the end, the last frame sits under the script's last line."""
    script = _script(tmp_path, "snaps.py", SNAPSHOTS)
    screen = pyte.Screen(COLS, ROWS)
    stream = pyte.ByteStream(screen)
    checked: list[list[str]] = []
    with _started(tmp_path, ["--out", "out", str(script), "out", "60", "0.04"],
                  _growing_view) as (term, pid):
        stream.feed(bytes(term.buf))
        fed = len(term.buf)
        end = time.monotonic() + 60
        # A frame may be painted between a line and its linefeed (the script's pty hands
        # them over apart, under load): look for the script's lines with frames taken out.
        while (b"line 60\r\n" not in _script_bytes(bytes(term.buf))
               and time.monotonic() < end):
            term.read_until(lambda b, seen=fed: len(b) > seen, 1)
            stream.feed(bytes(term.buf[fed:]))
            fed = len(term.buf)
            rows = _screen_rows(screen)
            view = [r for r in rows if r.startswith("view ")]
            settled = term.buf.endswith((b"\x1b8", b"\r\n"))  # not half a write
            if (settled and b"line 30\r\n" in _script_bytes(bytes(term.buf))
                    and len(view) >= 3):
                checked.append(rows)
        code = term.wait(60)
        stream.feed(bytes(term.buf[fed:]))
    assert code == 0, term.text
    assert checked, "the view never grew to 3 rows"
    for rows in checked:
        view = [i for i, r in enumerate(rows) if r.startswith("view ")]
        assert view == list(range(ROWS - len(view), ROWS)), rows  # the bottom rows, together
        above = rows[: view[0]]
        while above and not above[-1]:  # rows the view's growth just freed, under the cursor
            above.pop()
        # The rows above: the script's consecutive lines, none painted over or left out; at
        # most as many free rows under them as the view has (it grows by whole frames).
        assert all(r.startswith("line ") for r in above), rows
        text = [int(r.split()[1]) for r in above]
        assert len(text) >= ROWS - 2 * len(view), rows
        assert text == list(range(text[0], text[0] + len(text))), rows
    rows = [r for r in _screen_rows(screen) if r]
    last = rows.index("line 60")
    assert rows[last - 3: last + 1] == ["line 57", "line 58", "line 59", "line 60"], rows
    after = rows[last + 1:]
    assert after[0].startswith("traceml-ci: the script never imported torch"), rows  # wraps
    frame = after[next(i for i, r in enumerate(after) if r.startswith("view ")):-1]
    assert frame == [f"view {k + 1}/7 at step 60" for k in range(7)], rows  # all of it, once
    assert after[-1] == "traceml-ci: summary out/final_summary.json"
    assert sum(r.startswith("view ") for r in rows) == 7  # no view rows left behind


def test_not_a_terminal_gets_plain_progress_lines(tmp_path) -> None:
    script = _script(tmp_path, "snaps.py", SNAPSHOTS)
    _old_run(tmp_path)
    proc = run_group([*CLI, "--out", "out", "--progress-interval", "0.3", str(script), "out",
                      "30", "0.1"], tmp_path, timeout=60)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err
    assert out.startswith("ready") and "False False False None" in out.splitlines()[0]
    assert "line 30\n" in out  # the script's output as it wrote it
    progress = [ln for ln in err.splitlines() if ln.startswith("traceml-ci: step ")]
    assert len(progress) >= 3, err
    assert all("steps/s" in ln and "7777777" not in ln for ln in progress)
    counts = [int(ln.split()[2]) for ln in progress]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    assert "\x1b" not in out + err


#: A real traced job that idles before its first step, then trains for a while.
IDLE_THEN_TRAIN = """
import time, torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
time.sleep(1.0)  # traced (torch imported), no step yet: snapshots (every 0.5 s) say step 0
t0 = time.time()
while time.time() - t0 < 1.0:
    loss = model(torch.randn(32, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
"""


def test_progress_lines_wait_for_steps_and_say_the_end_once(tmp_path) -> None:
    """Piped (``run x.py 2>&1 | cat``): no ``step 0 · - steps/s`` lines before the first step,
    and the final line once, however long the launcher takes to finish after it."""
    script = _script(tmp_path, "idle.py", IDLE_THEN_TRAIN)
    proc = run_group([*CLI, "--out", "out", "--progress-interval", "0.1", str(script)],
                     tmp_path, timeout=120)
    err = proc.stderr
    assert proc.returncode == 0, err
    progress = [ln for ln in err.splitlines() if ln.startswith("traceml-ci: step ")]
    assert progress, err
    assert all(int(ln.split()[2]) > 0 for ln in progress), err
    assert not any("- steps/s · dl - fwd -" in ln for ln in progress), err
    ended = [ln for ln in progress if " · ended (" in ln]
    assert len(ended) == 1 and progress[-1] == ended[0], err
    assert err.count("summary written to out/final_summary.json") == 1, err


def test_progress_interval_zero_and_no_live(tmp_path) -> None:
    script = _script(tmp_path, "snaps.py", SNAPSHOTS)
    # (0.05 s steps: a snapshot every 0.25 s, runs of 0.75-1 s: lines every 0.2 s would show)
    proc = run_group([*CLI, "--out", "out", "--progress-interval", "0", str(script), "out",
                      "15", "0.05"], tmp_path, timeout=60,
                     env={**os.environ, "TRACEML_CI_PROGRESS_INTERVAL": "0.2"})
    err = proc.stderr
    assert proc.returncode == 0, err
    assert "traceml-ci: step" not in err  # the flag wins over the environment
    # --no-live on a terminal: the script keeps our terminal; progress lines come instead.
    term = Terminal(tmp_path, ["--no-live", "--progress-interval", "0.2", "--out", "out",
                               str(script), "out", "20", "0.05"])
    try:
        code = term.wait(60)
    finally:
        term.close()
    assert code == 0, term.text
    assert "\x1b7" not in term.text and "\x1b[1;" not in term.text
    assert "traceml-ci: step" in term.text
    assert f"os.terminal_size(columns={COLS}, lines={ROWS})" in term.text


def test_the_plugins_captured_launch_has_no_view_and_no_progress_lines(tmp_path) -> None:
    """The pytest plugin launches through launch(capture=True): a front door's company is
    not for it."""
    from traceml_ci.cli.live_run import ProgressLines
    from traceml_ci.tracer.launch import LaunchSpec, launch

    script = _script(tmp_path, "snaps.py", SNAPSHOTS)
    spec = LaunchSpec(target=str(script), args=("out", "20", "0.05"), out_dir="out")
    done = launch(spec, cwd=tmp_path, capture=True, timeout_s=60,
                  attach=ProgressLines(0.05))
    assert done.code == 0, done.output
    assert "line 20\n" in done.output
    assert "traceml-ci: step" not in done.output and "\x1b" not in done.output


def test_a_bad_progress_interval_is_one_line(tmp_path) -> None:
    script = _script(tmp_path, "snaps.py", SNAPSHOTS)
    proc = subprocess.run(
        [*CLI, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "TRACEML_CI_PROGRESS_INTERVAL": "soon"},
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "traceml-ci: error: $TRACEML_CI_PROGRESS_INTERVAL='soon' is not a number of seconds "
        ">= 0\n"
    )


def _interrupted(term: Terminal, tmp_path: Path) -> str:
    """Ctrl-C typed once on a running script's terminal: the script ends interrupted (130, one
    traceback, the summary says so). The terminal's text, newlines plain."""
    time.sleep(0.3)
    os.write(term.fd, b"\x03")
    code = term.wait(60)
    text = term.text.replace("\r\n", "\n")
    assert code == 130, text
    assert text.count("Traceback (most recent call last):") == 1, text
    assert _summary(tmp_path)["run"]["status"] == "interrupted"
    return text


def test_ctrl_c_reaches_the_script_through_its_terminal(tmp_path) -> None:
    script = _script(tmp_path, "forever.py", FOREVER)
    with _started(tmp_path, ["--out", "out", str(script)]) as (term, pid):
        assert "\nKeyboardInterrupt\n" in _interrupted(term, tmp_path)


def test_ctrl_c_with_stdin_elsewhere_reaches_the_scripts_group(tmp_path) -> None:
    """stdin not the terminal (< /dev/null): our terminal stays as it is and its Ctrl-C
    signals the launcher, which passes it to the script's group (as the terminal would)."""
    script = _script(tmp_path, "forever.py", FOREVER)
    with _started(tmp_path, ["--out", "out", str(script)], stdin_null=True) as (term, pid):
        assert b"\x1b[1;" in term.buf  # the view is on all the same
        _interrupted(term, tmp_path)


def test_a_second_ctrl_c_kills_a_script_that_ignores_the_first(tmp_path) -> None:
    script = _script(tmp_path, "stubborn.py", STUBBORN)
    with _started(tmp_path, ["--out", "out", str(script)]) as (term, pid):
        os.write(term.fd, b"\x03")
        assert term.read_until(lambda b: b"caught one" in b, 30), term.text
        os.write(term.fd, b"\x03")
        code = term.wait(60)
        gone = _gone(pid, 10)
    assert code == 130, term.text
    assert gone
    assert "second Ctrl-C: killed the script" in term.text
    assert "ended without a summary (exit 130)" in term.text
    assert _summary(tmp_path)["run"]["status"] == "interrupted"
    assert b"\x1b[r" in term.buf  # the terminal was given back


def test_sigterm_is_passed_on_and_the_run_is_interrupted(tmp_path) -> None:
    script = _script(tmp_path, "forever.py", FOREVER)
    with _started(tmp_path, ["--out", "out", str(script)]) as (term, pid):
        os.kill(term.pid, signal.SIGTERM)
        code = term.wait(60)
        gone = _gone(pid, 10)
    assert code == 143, term.text
    assert gone
    assert _summary(tmp_path)["run"]["status"] == "interrupted"


RESIZES = '''
import os, signal, time
signal.signal(signal.SIGWINCH, lambda *a: print("size", *os.get_terminal_size(1), flush=True))
print("ready", os.getpid(), flush=True)
end = time.time() + 60
while time.time() < end and not os.path.exists("stop"):
    time.sleep(0.02)
'''


def test_a_resized_terminal_resizes_the_scripts_and_the_view_follows(tmp_path) -> None:
    script = _script(tmp_path, "resizes.py", RESIZES)
    with _started(tmp_path, ["--out", "out", str(script)]) as (term, pid):
        termios.tcsetwinsize(term.fd, (ROWS + 10, COLS + 20))  # SIGWINCH to the launcher
        wide = re.compile(f"size {COLS + 20} (\\d+)\r\n".encode())

        def shrunk(b: bytes) -> bool:  # the full new size first, then less the view's rows
            return any(int(n) < ROWS + 10 for n in wide.findall(b))

        assert term.read_until(shrunk, 30), term.text
        (tmp_path / "stop").touch()
        code = term.wait(60)
    assert code == 0, term.text
    # The script got the new width and the new height less the view's rows; the view sits in
    # the rows below its scroll region.
    rows = min(int(n) for n in wide.findall(bytes(term.buf)))
    assert ROWS < rows < ROWS + 10
    assert f"\x1b[1;{rows}r".encode() in term.buf
    assert f"\x1b[{rows + 1};1H".encode() in term.buf


def test_ctrl_z_stops_the_job_and_continuing_resumes_it(tmp_path) -> None:
    """As a shell job: Ctrl-Z stops the launcher (the shell's prompt comes back) and the
    script; fg (SIGCONT) gives the script its terminal back and it finishes."""
    script = _script(tmp_path, "snaps.py", SNAPSHOTS)
    with _started(tmp_path, ["--out", "out", str(script), "out", "30", "0.05"]) as (term, pid):
        os.write(term.fd, b"\x1a")
        stopped = _stopped(term.pid, 30)
        assert stopped, term.text
        term.read_until(lambda b: False, 0.3)
        before = term.buf.count(b"line ")
        assert _state(pid) == "T"  # the script too
        term.read_until(lambda b: False, 0.5)
        assert term.buf.count(b"line ") == before  # nothing runs meanwhile
        os.kill(term.pid, signal.SIGCONT)
        code = term.wait(60)
    assert code == 0, term.text
    assert b"".join(f"line {i}\r\n".encode() for i in range(1, 31)) in _script_bytes(term.buf)


def _stopped(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if done:
            return os.WIFSTOPPED(status)
        time.sleep(0.05)
    return False


def _state(pid: int) -> str:
    """The process's state letter (R, S, T...) from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_at_rest_only_between_sequences() -> None:
    assert _at_rest(b"plain text\r\n")
    assert _at_rest(b"\x1b[31mred")
    assert _at_rest(b"title \x1b]0;name\x07 done")
    assert _at_rest(b"\x1b7")
    assert not _at_rest(b"abc\x1b")
    assert not _at_rest(b"abc\x1b[3")
    assert not _at_rest(b"abc\x1b[38;5;")
    assert not _at_rest(b"\x1b]0;a title not yet ended")
    assert not _at_rest("caf\u00e9".encode()[:-1])
    assert _at_rest("caf\u00e9".encode())
    assert not _at_rest("\u20ac".encode()[:2])


def test_a_real_traced_job_shows_its_split_and_diagnosis_live(tmp_path) -> None:
    """End to end across the three parts: the tracer's writer thread (tracer/live.py) writes
    snapshots while examples/input_bound.py trains; the launcher paints render_frame of them
    under the script's output; the last frame and the summary path stay."""
    example = Path(__file__).resolve().parents[2] / "examples" / "input_bound.py"
    # 200 steps of >= 8 ms (its samples' sleeps): snapshots (every 0.5 s) for several frames
    term = Terminal(tmp_path, ["--out", "out", str(example), "--steps", "200"])
    try:
        code = term.wait(180)
    finally:
        term.close()
    assert code == 0, term.text
    raw = bytes(term.buf)
    frames = [f for f in _PAINT.findall(raw) if b"steps/s" in f]
    assert frames, term.text[-3000:]  # painted while it ran, from the real snapshots
    assert any(b"INPUT_BOUND" in f for f in frames)
    tail = raw[raw.rindex(b"\x1b[?25h"):]
    assert b"INPUT_BOUND" in tail
    assert re.search(rb"traceml-ci: summary \S*out/final_summary.json", tail)
    assert _summary(tmp_path)["step_time"]["diagnosis"] == "INPUT_BOUND"
