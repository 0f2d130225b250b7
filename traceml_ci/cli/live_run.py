"""``traceml-ci run``'s company for the child: on a terminal, the script runs on a pseudo-terminal
and the live view is painted under its output; otherwise, plain progress lines on stderr.

How the view stays out of the script's way (terminal mode): the script's pseudo-terminal is
told it has ``rows - N`` rows, and our terminal's scroll region (DECSTBM) is set to those top
rows, so everything the script writes scrolls above the bottom ``N`` rows, which only we draw.
The script's bytes are copied to our stdout unchanged and in order (its stdout and stderr are
the same terminal, as in any terminal, so they arrive interleaved exactly as written). A frame
is painted between two of the script's writes, never inside an escape sequence or a UTF-8
character: saved cursor (DECSC), rows drawn, cursor restored (DECRC), so the script's cursor
and colours are as it left them. Limits: a script that saves the cursor itself (ESC 7/8), sets
its own scroll region, or draws a full screen is better run with ``--no-live``; painting stops
while it uses the alternate screen. Any failure of the view turns painting off (one warning at
the end); the script's output and exit code go through whatever happens.
"""

from __future__ import annotations

import io
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

try:
    import termios
    import tty
except ImportError:  # pragma: no cover - Windows: no terminal to take over, progress lines only
    termios = tty = None  # type: ignore[assignment]

from traceml_ci.cli import environment
from traceml_ci.cli.environment import ENV_PROGRESS_INTERVAL
from traceml_ci.summary.live import read_snapshots
from traceml_ci.tracer.launch import Attachment, Launched

#: Seconds between plain progress lines by default.
DEFAULT_PROGRESS_INTERVAL_S = 10.0
#: The view is repainted at most this often (seconds): 4 times a second.
PAINT_EVERY_S = 0.25
#: A frame waits for the script's output to pause this long (seconds) before it is painted...
QUIET_S = 0.02
#: ...but no longer than this (a script that never pauses still sees the view move).
PAINT_WAIT_MAX_S = 0.1
#: The frame is re-rendered at least this often even if no snapshot changed (stale ages).
RERENDER_S = 2.0
#: The view takes at most half the terminal, and none on one smaller than this.
MIN_ROWS, MIN_COLS = 10, 20
#: Seconds to keep copying output after the script ended (its workers may still write).
DRAIN_S = 2.0
#: Ctrl-C and Ctrl-Z as they arrive on a raw terminal.
CTRL_C, CTRL_Z = b"\x03", b"\x1a"
#: After copying output, wait this long (s) so the next read takes many lines at once: a
#: chatty script costs the launcher far less CPU, and nobody sees 4 ms.
COALESCE_S = 0.004
#: While the script writes, signals, snapshots and its end are looked at this often (s).
HOUSEKEEPING_S = 0.05

_CSI_DONE = re.compile(rb"\[[0-?]*[ -/]*[@-~]")
_ESC_DONE = re.compile(rb"[ -/]*[0-~]")
_ALT_ON = (b"\x1b[?1049h", b"\x1b[?47h", b"\x1b[?1047h")
_ALT_OFF = (b"\x1b[?1049l", b"\x1b[?47l", b"\x1b[?1047l")
_CLEARS = (b"\x1b[2J", b"\x1bc")


def progress_interval(flag: float | None, environ: dict[str, str] | None = None) -> float:
    """The progress-line interval in seconds: the flag, else $TRACEML_CI_PROGRESS_INTERVAL,
    else 10. Raises ValueError naming the variable when it is not a number >= 0."""
    if flag is not None:
        return flag
    raw = environment.progress_interval_text(environ)
    if raw is None or not raw.strip():
        return DEFAULT_PROGRESS_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:  # NaN and inf too: a thread would wait on them
        raise ValueError(f"${ENV_PROGRESS_INTERVAL}={raw!r} is not a number of seconds >= 0")
    return value


def attachment(*, live: bool, progress_interval_s: float) -> Attachment:
    """The company for ``traceml-ci run``'s child: the live view when our stdout and stderr are
    a terminal we own the foreground of, else progress lines (none when the interval is 0)."""
    if live and termios is not None and _terminal_here():
        return TerminalSession()
    if progress_interval_s > 0:
        return ProgressLines(progress_interval_s)
    return Attachment()


def this_runs_snapshots(out_dir: Path, since: float) -> list[dict[str, Any]]:
    """The snapshots under ``out_dir`` with a heartbeat since ``since`` (wall-clock seconds):
    a previous run's files in the same folder are not this run's view."""
    fresh = []
    for snap in read_snapshots(out_dir):
        beat = snap.get("heartbeat")
        if isinstance(beat, (int, float)) and beat >= since - 1.0:
            fresh.append(snap)
    return fresh


def _terminal_here() -> bool:
    try:
        if not (os.isatty(1) and os.isatty(2)) or environment.dumb_terminal():
            return False
        # A background job (cmd &) must not take the terminal: raw mode would stop it (SIGTTOU).
        return os.tcgetpgrp(1) == os.getpgrp()
    except OSError:
        return False


class ProgressLines(Attachment):
    """A plain line on ``stream`` every ``interval_s`` seconds once the job has a step past
    warmup (figures to show);
    the run's last line (``... · ended (completed)``) once, when it ends. The child's own
    output is untouched (it shares our stdio)."""

    def __init__(self, interval_s: float, stream: TextIO | None = None) -> None:
        self.interval_s = interval_s
        self.stream = stream
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._out = Path(".")
        self._since = time.time()
        self._last: str | None = None
        self._said_end = False

    def popen_kwargs(self, out_dir: Path) -> dict[str, Any]:
        self._out, self._since = out_dir, time.time()
        return {}

    def _say(self, *, again: bool) -> bool:
        """Write the current line; False once nothing more is to be said (the end was said, or
        stderr is closed). ``again``: also a line the same as the last one (a heartbeat)."""
        from traceml_ci.cli.live_view import plain_progress_line, run_ended

        if self._said_end:
            return False
        snaps = this_runs_snapshots(self._out, self._since)
        steps = [s.get("steps_done") for s in snaps]
        if not any(isinstance(n, int) and n > 0 for n in steps):
            return True  # nothing traced yet: say nothing rather than "step 0 · -"
        analysed = [(s.get("window") or {}).get("steps") for s in snaps]
        if not run_ended(snaps) and not any(isinstance(n, int) and n > 0 for n in analysed):
            return True  # warmup steps only (a slow start): no figures yet, so no line
        line = plain_progress_line(snaps)
        if line == self._last and not again:
            return True
        self._said_end = run_ended(snaps)
        try:
            stream = self.stream or sys.stderr
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed: nobody to tell
            return False
        self._last = line
        return not self._said_end

    def started(self, proc: subprocess.Popen) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                if not self._say(again=True):
                    return

        self._thread = threading.Thread(target=loop, name="traceml-ci-progress", daemon=True)
        self._thread.start()

    def ended(self, done: Launched | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._say(again=False)  # the last line, if the loop has not said it


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _at_rest(tail: bytes) -> bool:
    """Whether output ending in ``tail`` leaves the terminal between sequences: not inside an
    escape sequence (CSI, a string such as an OSC title, a short ESC sequence) nor a UTF-8
    character."""
    esc = tail.rfind(b"\x1b")
    if esc >= 0:
        seq = tail[esc + 1:]
        if not seq:
            return False
        if seq[:1] == b"[":
            if not _CSI_DONE.match(seq):
                return False
        elif seq[:1] in (b"]", b"P", b"X", b"^", b"_"):
            if b"\x07" not in seq:  # ended by BEL; an ST ending (ESC \\) is an ESC of its own
                return False
        elif not _ESC_DONE.match(seq):
            return False
    for back in range(1, min(4, len(tail)) + 1):
        byte = tail[-back]
        if byte < 0x80:
            return True
        if byte >= 0xC0:  # a UTF-8 lead byte: has its continuation arrived?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back >= need
    return True


class _Stream:
    """Where the script's output stands: at rest (a frame may be painted) or mid-sequence,
    when it last wrote, and whether its cursor is at the start of a line."""

    def __init__(self) -> None:
        self.pending = b""
        self.at_rest = True
        self.line_open = False
        self.last_write = 0.0
        self.alt_screen = False
        self.cleared = False

    def saw(self, data: bytes, now: float) -> None:
        buf = self.pending + data
        self.at_rest = _at_rest(buf) or len(buf) > 4096  # a sequence that never ends: give up
        if self.at_rest:
            self.pending = b""
        else:
            esc = buf.rfind(b"\x1b")
            self.pending = buf[esc:] if esc >= 0 else buf[-4:]
        self.line_open = data[-1:] not in (b"\n", b"\r")
        self.last_write = now
        if b"\x1b" in data:
            if any(s in buf for s in _ALT_ON):
                self.alt_screen = True
            if any(s in buf for s in _ALT_OFF):
                self.alt_screen = False
            if any(s in buf for s in _CLEARS):
                self.cleared = True


class _Painter:
    """The bottom rows of our terminal: reserves them (scroll region) and draws frames there."""

    def __init__(self, fd: int, set_child_rows: Callable[[int, int], None]) -> None:
        from rich.console import Console

        self.fd = fd
        self.set_child_rows = set_child_rows
        size = os.get_terminal_size(fd)
        self.rows, self.cols = size.lines, size.columns
        self.reserved = 0
        self.console = Console(file=io.StringIO(), force_terminal=True,
                               width=max(self.cols, MIN_COLS), legacy_windows=False,
                               soft_wrap=False, highlight=False)

    @property
    def room(self) -> int:
        return 0 if self.rows < MIN_ROWS or self.cols < MIN_COLS else self.rows // 2

    def render(self, snapshots: list[dict[str, Any]]) -> list[str]:
        from traceml_ci.cli.live_view import render_frame

        with self.console.capture() as cap:
            self.console.print(render_frame(snapshots, now=time.time(), width=self.cols,
                                            height=self.room or None))
        return cap.get().rstrip("\n").split("\n")

    def show(self, lines: list[str]) -> None:
        """Draw a frame in the bottom rows, making room first if it grew (grow only): one
        write, so the terminal never shows half of it. Linefeeds from the cursor scroll the
        script's text up before the scroll region shrinks, so none of it is under the view."""
        n = min(len(lines), self.room)
        grew = n > self.reserved
        out = ""
        if grew:
            top = self.rows - n
            out += (
                "\x1b7\x1b[r\x1b8"  # the whole screen scrolls while we make room
                + "\n" * n + f"\x1b[{n}A"
                + f"\x1b7\x1b[1;{top}r\x1b8"  # DECSTBM homes the cursor: save, restore
            )
            self.reserved = n
        if self.reserved > 0:
            first = self.rows - self.reserved + 1
            shown = lines[:self.reserved] + [""] * (self.reserved - len(lines))
            out += "\x1b7" + "".join(f"\x1b[{first + i};1H\x1b[0m\x1b[2K{line}"
                                     for i, line in enumerate(shown)) + "\x1b[0m\x1b8"
        if out:
            _write_all(self.fd, out.encode())
        if grew:
            self.set_child_rows(self.rows - n, self.cols)

    def resized(self) -> None:
        """Our terminal changed size: start over with a fresh region."""
        size = os.get_terminal_size(self.fd)
        self.rows, self.cols = size.lines, size.columns
        self.console.width = max(self.cols, MIN_COLS)
        _write_all(self.fd, b"\x1b7\x1b[r\x1b8")
        self.reserved = 0
        self.set_child_rows(self.rows, self.cols)

    def release(self, line_open: bool) -> None:
        """At the end: the whole screen back to the text, the view's rows cleared, the cursor
        visible and on a fresh line under the script's last output."""
        end = "\r\n" if line_open else ""
        _write_all(self.fd, f"\x1b7\x1b[r\x1b8{end}\x1b[0m\x1b[J\x1b[?25h".encode())
        self.reserved = 0

    def withdraw(self) -> None:
        """While the script runs: the view's rows cleared and given back to it, its cursor
        left where it was."""
        top = self.rows - self.reserved + 1
        rows = "".join(f"\x1b[{top + i};1H\x1b[2K" for i in range(self.reserved))
        _write_all(self.fd, f"\x1b7\x1b[r{rows}\x1b8".encode())
        self.reserved = 0
        self.set_child_rows(self.rows, self.cols)


class TerminalSession(Attachment):
    """The child on a pseudo-terminal, its output copied through, our keystrokes forwarded
    (our terminal in raw mode meanwhile), the live view painted under its output, and the
    endings: a second Ctrl-C kills the script; SIGTERM is passed on."""

    def __init__(self, *, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.master: int | None = None
        self.slave: int | None = None
        self.saved_tty: list[Any] | None = None
        self.stream = _Stream()
        self.painter: _Painter | None = None
        self.out = Path(".")
        self.since = time.time()
        self.problem: str | None = None
        self.killed = False
        self.final_frame = True
        self._snaps: list[dict[str, Any]] | None = None
        self._lines: list[str] | None = None
        self._painted: list[str] | None = None
        self._checked = 0.0
        self._rendered = 0.0
        self._due_since: float | None = None

    # -- the child's stdio --------------------------------------------------------------

    def popen_kwargs(self, out_dir: Path) -> dict[str, Any]:
        import pty

        self.out, self.since = out_dir, time.time()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            self.master, self.slave = pty.openpty()
            if os.isatty(self.stdin_fd):  # the script's terminal starts with our settings
                termios.tcsetattr(self.slave, termios.TCSANOW, termios.tcgetattr(self.stdin_fd))
            size = os.get_terminal_size(self.stdout_fd)
            termios.tcsetwinsize(self.slave, (size.lines, size.columns))
        except (OSError, termios.error) as exc:
            self._close_fds()
            self.problem = f"no pseudo-terminal ({exc}); the script's output goes straight through"
            return {}
        return {
            "stdin": self.slave if os.isatty(self.stdin_fd) else None,
            "stdout": self.slave,
            "stderr": self.slave,
            "start_new_session": True,  # its own session, so the pty can be its terminal
            "preexec_fn": _take_terminal,
        }

    def started(self, proc: subprocess.Popen) -> None:
        if self.master is None:
            return
        os.close(self.slave)  # the child has it; our copy would keep the pty open
        self.slave = None
        os.set_blocking(self.master, False)  # never stuck on a script that does not read
        if os.isatty(self.stdin_fd):
            try:
                saved = termios.tcgetattr(self.stdin_fd)
                tty.setraw(self.stdin_fd, termios.TCSANOW)
                self.saved_tty = saved
            except termios.error as exc:  # keys then stay ours: Ctrl-C still reaches it
                self.problem = f"keystrokes not passed to the script ({exc})"
        try:
            self.painter = _Painter(self.stdout_fd, self._set_child_rows)
            self._tick(time.monotonic(), force=True)
        except Exception as exc:  # the view is a nicety: never at the script's expense
            self._view_failed(exc)

    def _set_child_rows(self, rows: int, cols: int) -> None:
        if self.master is not None:
            termios.tcsetwinsize(self.master, (max(rows, 1), cols))  # SIGWINCH to the script

    # -- waiting: copy output, forward input and signals, paint ---------------------------

    def wait(self, proc: subprocess.Popen, timeout_s: float | None) -> int | None:
        if self.master is None:
            return None
        main = threading.current_thread() is threading.main_thread()
        wanted = {signal.SIGINT, signal.SIGTERM, signal.SIGWINCH}
        if main:
            signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
        try:
            return self._pump(proc, timeout_s, wanted if main else set())
        finally:
            if main:
                while signal.sigtimedwait(wanted, 0) is not None:
                    pass
                signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)

    def _pump(self, proc: subprocess.Popen, timeout_s: float | None, wanted: set[int]) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stdin = self.stdin_fd if self.saved_tty is not None else None
        fds = [self.master] + ([stdin] if stdin is not None else [])
        interrupts = 0
        looked = 0.0
        while True:
            ready, _, _ = select.select(fds, [], [], HOUSEKEEPING_S)
            now = time.monotonic()
            if self.master in ready:
                if self._copy_output(now):
                    time.sleep(COALESCE_S)  # a chatty script's lines, copied in fewer reads
                else:
                    fds.remove(self.master)  # EIO: nothing holds the script's terminal now
            if stdin in ready:
                try:
                    data = os.read(stdin, 4096)
                except OSError:  # our terminal hung up
                    data = b""
                keys = self._child_keys() if data else None
                if not data:
                    fds.remove(stdin)
                elif keys and keys[0] and keys[0] in data:
                    interrupts += data.count(keys[0])
                    if interrupts >= 2:
                        return self._kill(proc)
                    self._type(data)
                elif keys and keys[1] and keys[1] in data:
                    self._suspend(proc)
                else:
                    self._type(data)
            if ready and now - looked < HOUSEKEEPING_S:
                continue  # a busy script: look at signals, snapshots and its end 20 times a s
            looked = now
            for signum, origin in _pending(wanted):
                if signum == signal.SIGWINCH:
                    self._resized()
                elif signum == signal.SIGTERM:
                    _send(proc, signal.SIGTERM, group=False)
                else:  # SIGINT: from kill, or our terminal's Ctrl-C when stdin is not it
                    interrupts += 1
                    if interrupts >= 2:
                        return self._kill(proc)
                    _send(proc, signal.SIGINT, group=origin == _SI_KERNEL)
            self._tick(now)
            code = proc.poll()
            if code is not None:
                self._drain()
                return code
            if deadline is not None and now >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout_s or 0.0)

    def _copy_output(self, now: float) -> bool:
        try:
            data = os.read(self.master, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        self.stream.saw(data, now)
        try:
            _write_all(self.stdout_fd, data)
        except OSError:  # our terminal is gone: keep reading so the script never blocks
            pass
        return True

    def _type(self, data: bytes) -> None:
        """Our keystrokes to the script's terminal; what does not fit in its full input
        buffer (a script that never reads) is dropped, as a terminal would."""
        try:
            os.write(self.master, data)
        except OSError:  # a full buffer (BlockingIOError), or the script closed its terminal
            pass

    def _drain(self) -> None:
        """What the script wrote just before it ended (and its workers, for a moment)."""
        end = time.monotonic() + DRAIN_S
        while time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready or not self._copy_output(time.monotonic()):
                return

    def _child_keys(self) -> tuple[bytes | None, bytes | None] | None:
        """The script terminal's interrupt and suspend keys (Ctrl-C, Ctrl-Z), or None when it
        does not turn keys into signals (a script that put its terminal in raw mode)."""
        try:
            attrs = termios.tcgetattr(self.master)
        except termios.error:
            return CTRL_C, CTRL_Z
        if not attrs[3] & termios.ISIG:
            return None
        keys = attrs[6][termios.VINTR], attrs[6][termios.VSUSP]
        return tuple(k if isinstance(k, bytes) and k != b"\x00" else None  # type: ignore[return-value]
                     for k in keys)

    def _suspend(self, proc: subprocess.Popen) -> None:
        """Ctrl-Z: stop the script and ourselves, giving the terminal back to the shell; on
        ``fg``, take it again and let the script go on. (The script's terminal cannot stop it:
        a terminal's stop keys do nothing to a session whose leader's parent is elsewhere.)"""
        _send(proc, signal.SIGSTOP, group=True)
        painter = self.painter
        if painter is not None:
            try:
                painter.withdraw()
            except Exception as exc:
                self._view_failed(exc)
                painter = None
        if self.saved_tty is not None:
            termios.tcsetattr(self.stdin_fd, termios.TCSADRAIN, self.saved_tty)
        os.kill(os.getpid(), signal.SIGSTOP)  # the shell sees the job stopped
        # Continued (fg): raw again, the view's rows again, the script on its way.
        if self.saved_tty is not None:
            tty.setraw(self.stdin_fd, termios.TCSANOW)
        _send(proc, signal.SIGCONT, group=True)
        if painter is not None:
            self._painted = None
            self._tick(time.monotonic(), force=True)

    def _kill(self, proc: subprocess.Popen) -> int:
        """The second Ctrl-C: the script and everything in its session's group, now."""
        self.killed = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        self._drain()
        return -signal.SIGINT

    def _resized(self) -> None:
        if self.painter is None:  # no view: the script gets our whole new size
            try:
                size = os.get_terminal_size(self.stdout_fd)
                self._set_child_rows(size.lines, size.columns)
            except (OSError, termios.error):
                pass
            return
        try:
            self.painter.resized()
            self._painted = None  # the region is new: draw it even if unchanged
            self._tick(time.monotonic(), force=True)
        except Exception as exc:
            self._view_failed(exc)

    # -- painting --------------------------------------------------------------------------

    def _tick(self, now: float, force: bool = False) -> None:
        """At most 4 times a second: read the snapshots; paint a changed frame when the
        script's output is at rest and has paused (or the frame waited long enough)."""
        if self.painter is None:
            return
        try:
            if force or now - self._checked >= PAINT_EVERY_S:
                self._checked = now
                snaps = this_runs_snapshots(self.out, self.since)
                if force or snaps != self._snaps or now - self._rendered >= RERENDER_S:
                    self._snaps, self._rendered = snaps, now
                    self._lines = self.painter.render(snaps)
            if self.stream.cleared:
                self.stream.cleared, self._painted = False, None
            if self._lines is None or self._lines == self._painted or self.stream.alt_screen:
                self._due_since = None
                return
            if self._due_since is None:
                self._due_since = now
            quiet = now - self.stream.last_write >= QUIET_S
            waited = now - self._due_since >= PAINT_WAIT_MAX_S
            if self.stream.at_rest and (force or quiet or waited):
                self.painter.show(self._lines)
                self._painted, self._due_since = self._lines, None
        except Exception as exc:
            self._view_failed(exc)

    def _view_failed(self, exc: BaseException) -> None:
        painter, self.painter = self.painter, None
        self.final_frame = False
        self.problem = f"live view off ({type(exc).__name__}: {exc})"
        if painter is not None:
            try:
                painter.withdraw()
            except (OSError, termios.error):
                pass

    # -- the end ---------------------------------------------------------------------------

    def ended(self, done: Launched | None) -> None:
        try:
            if self.saved_tty is not None:
                termios.tcsetattr(self.stdin_fd, termios.TCSADRAIN, self.saved_tty)
                self.saved_tty = None
        finally:
            self._close_fds()
            self._finish(done)

    def _finish(self, done: Launched | None) -> None:
        painter, self.painter = self.painter, None
        try:
            if painter is not None:
                painter.release(self.stream.line_open)
            snaps = this_runs_snapshots(self.out, self.since)
            if painter is not None and snaps and self.final_frame:
                text = "\n".join(painter.render(snaps)) + "\n"
                path = snaps[0].get("summary_path")
                if done is not None and not done.fallback and (path or done.summary.exists()):
                    text += f"traceml-ci: summary {_one_line(path or done.summary)}\n"
                sys.stdout.flush()
                _write_all(self.stdout_fd, text.encode())  # where the script's output went
        except Exception as exc:  # the final frame is a nicety too
            self.problem = self.problem or f"live view off ({type(exc).__name__}: {exc})"
        if self.killed:
            print("traceml-ci: second Ctrl-C: killed the script", file=sys.stderr)
        if self.problem:
            print(f"traceml-ci: warning: {self.problem}", file=sys.stderr)

    def _close_fds(self) -> None:
        for name in ("master", "slave"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                try:
                    os.close(fd)
                except OSError:
                    pass


#: Linux's si_code for a signal the kernel sent (a terminal's Ctrl-C to its foreground group).
_SI_KERNEL = 0x80


def _pending(wanted: set[int]) -> list[tuple[int, int]]:
    got = []
    while wanted:
        info = signal.sigtimedwait(wanted, 0)
        if info is None:
            break
        got.append((info.si_signo, info.si_code))
    return got


def _send(proc: subprocess.Popen, signum: int, *, group: bool) -> None:
    """A signal to the script, or to its whole group as a terminal's Ctrl-C would."""
    try:
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    except ProcessLookupError:
        pass


def _take_terminal() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The pseudo-terminal (our stdout now) becomes the session's controlling terminal, so its
    Ctrl-C and window-size changes reach the script's process group."""
    import fcntl

    fcntl.ioctl(1, termios.TIOCSCTTY, 0)


def _one_line(path: object) -> str:
    from traceml_ci.gate import fmt

    return fmt.plain(str(path))
