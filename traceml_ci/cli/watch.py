"""``traceml-ci watch [DIR]``: attach the live view to a job that is already running, from
another shell (or host, with the output folder mounted), by reading its snapshots.

Read-only: watch never writes to the folder nor signals the job, so Ctrl-C here stops only the
watching. Endings, and their exit codes:

- the job ends (every rank wrote its final snapshot): the final frame, then
  ``traceml-ci: run ended (<status>); summary: <path>``, exit 0;
- no job writes there (no live folder, or no readable snapshot in it): one line naming the
  folder, exit 2;
- every rank still marked running has been stale (no heartbeat for ``STALE_AFTER_S`` seconds)
  for more than ``--give-up`` seconds more: the last frame, one line, exit 2 -- the job hung or
  died without a last word, and nothing more will come;
- Ctrl-C: exit 130, no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from traceml_ci.cli import environment
from traceml_ci.cli.options import seconds
from traceml_ci.summary.keys import DEFAULT_OUT_DIR, ENV_OUT
from traceml_ci.summary.live import ENDED, SNAPSHOT_INTERVAL_S, STALE_AFTER_S

#: Seconds between plain progress lines when stdout is not a terminal.
DEFAULT_INTERVAL_S = 10.0
#: Seconds every running rank may stay stale before watch gives up.
DEFAULT_GIVE_UP_S = 60.0
#: The view repaints at most this often (and reads the folder as often).
REFRESH_PER_S = 4
#: Without a new snapshot, the view still repaints this often, to age the heartbeats.
REPAINT_S = 1.0
#: Seconds of slack when telling a previous run's snapshots from this one's (``started_at``
#: is written to the second).
PREVIOUS_RUN_SLACK_S = 2.0
#: Files in the live folder, none readable yet (a writer starting): wait this long before
#: saying nobody writes there.
ATTACH_GRACE_S = 2 * SNAPSHOT_INTERVAL_S


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "watch",
        help="follow a running job's live view from another shell",
        description="Attach to a job that traceml-ci is tracing, by reading the snapshots it "
        "writes to <DIR>/live/: the live view on a terminal, a plain progress line every "
        "--interval seconds otherwise. Exits 0 when the job ends (printing its summary's path), "
        "2 when no job writes there or every rank's heartbeat stayed stale past --give-up, "
        "130 on Ctrl-C. Never touches the job.",
    )
    p.add_argument("dir", nargs="?", metavar="DIR", default=None,
                   help=f"the job's output folder (default: ${ENV_OUT}, else ./{DEFAULT_OUT_DIR})")
    p.add_argument("--interval", type=seconds("--interval"), default=DEFAULT_INTERVAL_S,
                   metavar="S",
                   help="seconds between plain progress lines when stdout is not a terminal "
                   f"(default {DEFAULT_INTERVAL_S:g})")
    p.add_argument("--give-up", type=seconds("--give-up"), default=DEFAULT_GIVE_UP_S, metavar="S",
                   dest="give_up",
                   help="exit (code 2) once every running rank has been stale this many seconds "
                   f"(default {DEFAULT_GIVE_UP_S:g})")
    p.add_argument("--wait", type=seconds("--wait", zero="do not wait"), default=0.0, metavar="S",
                   help="wait up to this many seconds for a job to start writing there "
                   "(default 0: say at once that none is)")
    p.add_argument("--once", action="store_true",
                   help="print one frame (one line when not a terminal) and exit")
    p.add_argument("--plain", action="store_true",
                   help="plain progress lines even on a terminal")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from traceml_ci.cli.output import stdout_console
    from traceml_ci.errors import ExitCode

    out_dir = Path(args.dir or environment.out_dir() or DEFAULT_OUT_DIR)
    console = stdout_console()
    try:
        return follow(out_dir, console=console,
                      live=console.is_interactive and not args.plain,
                      interval=args.interval, give_up=args.give_up, once=args.once,
                      wait=args.wait)
    except KeyboardInterrupt:
        print("traceml-ci: stopped watching (the job itself was not touched)", file=sys.stderr)
        return ExitCode.INTERRUPTED


def follow(
    out_dir: str | os.PathLike[str],
    *,
    console: Any,
    live: bool,
    interval: float = DEFAULT_INTERVAL_S,
    give_up: float = DEFAULT_GIVE_UP_S,
    once: bool = False,
    wait: float = 0.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow ``out_dir``'s snapshots on ``console`` until the job ends (returns 0) or is gone
    (raises ``InputError``). ``live``: a rich Live view (a terminal); else plain lines every
    ``interval`` seconds. ``wait``: seconds to wait for a first snapshot. ``clock``
    (wall-clock seconds, compared with the writers' heartbeats) and ``sleep`` are parameters so
    tests can drive the loop."""
    from traceml_ci.errors import ExitCode

    snaps = _attach(out_dir, wait, clock, sleep)
    if once:
        _show(console, snaps, clock(), live)
        if _ended(snaps):
            _say(console, _ending_line(snaps))
        return ExitCode.OK
    follower = _Follower(out_dir, snaps)
    if live:
        _follow_live(follower, console, give_up, clock, sleep)
    else:
        _follow_plain(follower, console, interval, give_up, clock, sleep)
    _say(console, _ending_line(follower.snaps))
    return ExitCode.OK


class _Follower:
    """The latest snapshots of a folder, re-read only when a file in it changed."""

    def __init__(self, out_dir: str | os.PathLike[str], snaps: list[dict[str, Any]]) -> None:
        from traceml_ci.summary.live import live_dir

        self.out_dir = out_dir
        self.folder = live_dir(out_dir)
        self.snaps = snaps
        self._seen: object = None

    def poll(self) -> bool:
        """Re-read if anything changed; True when the snapshots did. A folder emptied or
        removed meanwhile keeps the last ones (their heartbeats age into stale)."""
        from traceml_ci.summary.live import read_snapshots

        seen = _signature(self.folder)
        if seen == self._seen:
            return False
        self._seen = seen
        fresh = current_run(read_snapshots(self.out_dir))
        if not fresh or fresh == self.snaps:
            return False
        self.snaps = fresh
        return True


def _signature(folder: Path) -> object:
    """What changes when a snapshot is rewritten: each rename brings a new inode, and mtime and
    size besides (a stat per rank, cheaper than parsing every file four times a second)."""
    try:
        with os.scandir(folder) as it:
            return sorted((e.name, e.inode(), e.stat().st_mtime_ns, e.stat().st_size) for e in it
                          if e.name.startswith("rank") and e.name.endswith(".json"))
    except OSError:
        return None


def _attach(out_dir: str | os.PathLike[str], wait: float, clock: Callable[[], float],
            sleep: Callable[[float], None]) -> list[dict[str, Any]]:
    """The first readable snapshots, waiting up to ``wait`` seconds for them (at least
    ``ATTACH_GRACE_S`` once the live folder exists: a writer may be starting)."""
    from traceml_ci.errors import InputError
    from traceml_ci.summary.live import live_dir, read_snapshots

    folder = live_dir(out_dir)
    start = clock()
    while True:
        exists = folder.is_dir()
        snaps = current_run(read_snapshots(out_dir)) if exists else []
        if snaps:
            return snaps
        waited = clock() - start
        if waited >= wait and (not exists or waited >= ATTACH_GRACE_S):
            break
        sleep(SNAPSHOT_INTERVAL_S / 2)
    if not exists:
        raise InputError(str(folder), "no live folder: no traceml-ci job is writing here "
                         "(start one with `traceml-ci run`, or name its output folder as DIR)")
    raise InputError(str(folder), "no readable snapshot (rank<N>.json): no traceml-ci job is "
                     "writing here")


def _epoch(value: Any) -> float | None:
    """``started_at`` as seconds since the epoch: an ISO 8601 string (as the tracer writes it)
    or a number."""
    from datetime import datetime, timezone

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def current_run(snaps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The snapshots of the newest run in the folder: a rank whose last heartbeat came before
    the newest run started is a previous run's leftover (a run with more ranks, in the same
    output folder), not one of this run's."""
    starts = [t for t in (_epoch(s.get("started_at")) for s in snaps) if t is not None]
    if not starts:
        return list(snaps)
    since = max(starts) - PREVIOUS_RUN_SLACK_S

    def older(snap: Mapping[str, Any]) -> bool:
        beat = snap.get("heartbeat")
        return isinstance(beat, (int, float)) and not isinstance(beat, bool) and beat < since

    return [s for s in snaps if not older(s)] or list(snaps)


def _ended(snaps: Sequence[Mapping[str, Any]]) -> bool:
    from traceml_ci.cli.live_view import run_ended

    return run_ended(snaps)


def _ending_line(snaps: Sequence[Mapping[str, Any]]) -> str:
    from traceml_ci.cli.live_view import ending_line

    return ending_line(snaps)


def gone_for(snaps: Sequence[Mapping[str, Any]], now: float) -> float | None:
    """How long every rank still marked running has been stale (seconds past the stale mark,
    by the youngest heartbeat), or None when one is fresh or none is running."""
    running = [s for s in snaps if s.get("status") not in ENDED]
    if not running:
        return None
    beats = [s.get("heartbeat") for s in running]
    if any(not isinstance(b, (int, float)) or isinstance(b, bool) for b in beats):
        fresh = [b for b in beats if isinstance(b, (int, float)) and not isinstance(b, bool)]
        if not fresh:
            return float("inf")
        beats = fresh
    past = now - max(beats) - STALE_AFTER_S
    return past if past > 0 else None


def _check_gone(folder: Path, snaps: Sequence[Mapping[str, Any]], now: float,
                give_up: float) -> None:
    from traceml_ci.errors import InputError

    past = gone_for(snaps, now)
    if past is not None and past > give_up:
        age = past + STALE_AFTER_S
        age_text = "unknown" if age == float("inf") else f"{age:,.0f} s"
        raise InputError(str(folder), f"every running rank's last heartbeat is {age_text} old "
                         f"(stale for over {give_up:g} s): the job stopped writing here (hung, "
                         "killed, or its host's clock differs); giving up")


def _show(console: Any, snaps: Sequence[Mapping[str, Any]], now: float, live: bool) -> None:
    from traceml_ci.cli.live_view import plain_progress_line, render_frame

    if live:
        console.print(render_frame(snaps, now=now, width=console.width))  # it may scroll
    else:
        _say(console, plain_progress_line(snaps, now=now))


def _say(console: Any, line: str) -> None:
    """One line as it is: ``Console.out`` applies no markup and no wrapping (a log line stays
    one line); the lines are built from ``fmt.plain`` text, so hold no control characters."""
    console.out(line, highlight=False)


def _follow_live(follower: _Follower, console: Any, give_up: float,
                 clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
    from rich.live import Live

    from traceml_ci.cli.live_view import render_frame

    with Live(console=console, auto_refresh=False, transient=False,
              redirect_stdout=False, redirect_stderr=False) as view:
        painted = float("-inf")
        changed = True
        while True:
            now = clock()
            if changed or now - painted >= REPAINT_S:
                view.update(render_frame(follower.snaps, now=now, width=console.width,
                                         height=console.height), refresh=True)
                painted = now
            if _ended(follower.snaps):
                return
            _check_gone(follower.folder, follower.snaps, now, give_up)
            sleep(1.0 / REFRESH_PER_S)
            changed = follower.poll()


def _follow_plain(follower: _Follower, console: Any, interval: float, give_up: float,
                  clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
    from traceml_ci.cli.live_view import plain_progress_line

    next_line = float("-inf")
    while True:
        now = clock()
        ended = _ended(follower.snaps)
        if ended or now >= next_line:
            _say(console, plain_progress_line(follower.snaps, now=now))
            next_line = now + interval
        if ended:
            return
        _check_gone(follower.folder, follower.snaps, now, give_up)
        # Poll faster than the lines, to print the end as soon as it is written.
        sleep(min(interval, SNAPSHOT_INTERVAL_S))
        follower.poll()
