"""The launcher's own cost while it shows the live view: CPU time of the ``traceml-ci run``
process (not the script's) as % of one core, and the latency from a step finishing to the view
showing it (targets: <= 5 % and < 1 s).

The launcher runs as the foreground job of a pseudo-terminal that this script reads, as a user's
terminal would. The job prints a line per step (a chatty script: the launcher copies every byte)
and writes a live snapshot every ``SNAPSHOT_INTERVAL_S`` as the tracer's writer thread does,
noting when each snapshotted step finished. A step's latency: from its end to the first painted
frame that shows it (or a later step). The frame is found by ``FRAME_STEP``, the step count as
``render_frame`` writes it (``step 1,234``).

    python benchmarks/live_launcher_cost.py [--seconds 20] [--step-ms 5]
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import signal
import statistics
import sys
import tempfile
import termios
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
ROWS, COLS = 40, 120
#: A painted frame (saved cursor ... restored cursor) and the step count it shows.
FRAME = re.compile(rb"\x1b7(.*?)\x1b8", re.S)
FRAME_STEP = re.compile(rb"step (\d[\d,]*)")  # render_frame writes "step 1,234"

JOB = '''
import json, os, sys, time
from traceml_ci.fsutil import atomic_write_text
from traceml_ci.summary.live import SNAPSHOT_INTERVAL_S, snapshot_from_summary, snapshot_path

out, seconds, step_ms, marks = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
identity = {"run_name": "bench", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h",
            "pid": os.getpid(), "started_at": time.time()}
window = {"step_time": {"steps_analyzed": 100, "dataloader_pct": 40.0, "forward_pct": 30.0,
                        "backward_pct": 20.0, "optimizer_pct": 10.0,
                        "step_ms": {"median": step_ms, "p90": step_ms}, "clock": "host"}}
finished, step, start = {}, 0, time.time()
next_snap = start + SNAPSHOT_INTERVAL_S
while time.time() - start < seconds:
    end = time.perf_counter() + step_ms / 1000
    while time.perf_counter() < end:
        pass
    step += 1
    print(f"step {step} loss 0.{step % 997:03d}", flush=True)
    now = time.time()
    if now >= next_snap:
        next_snap = now + SNAPSHOT_INTERVAL_S
        finished[step] = now
        snap = snapshot_from_summary(window, steps_done=step, steps_per_s=step / (now - start),
                                     history_ms=[step_ms] * 3, first_window_pct=None,
                                     memory={}, identity=identity, heartbeat=now)
        atomic_write_text(snapshot_path(out, 0), json.dumps(snap))
with open(marks, "w") as fh:
    json.dump(finished, fh)
'''


def run(seconds: float, step_ms: float) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="live-launcher-cost-"))
    (tmp / "job.py").write_text(JOB)
    marks = tmp / "marks.json"
    args = [sys.executable, "-m", "traceml_ci", "run", "--out", "out", "job.py", "out",
            str(seconds), str(step_ms), str(marks)]
    pid, fd = pty.fork()
    if pid == 0:  # the launcher, in a fresh terminal
        try:
            os.chdir(tmp)
            termios.tcsetwinsize(0, (ROWS, COLS))
            os.environ["PYTHONPATH"] = str(ROOT)
            os.execv(sys.executable, args)
        finally:
            os._exit(127)
    launcher = psutil.Process(pid)
    seen: list[tuple[float, int]] = []  # (when, step) of each painted frame
    raw = bytearray()
    cpu: list[tuple[float, float]] = []  # (wall, launcher user+system)
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 0.1)
            now = time.time()
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                start = max(0, len(raw) - 4096)  # a frame split across reads
                raw += chunk
                for m in FRAME.finditer(raw, start):
                    step = FRAME_STEP.search(m.group(1))
                    if step and m.end() > len(raw) - len(chunk):
                        seen.append((now, int(step.group(1).replace(b",", b""))))
            try:
                t = launcher.cpu_times()
                cpu.append((now, t.user + t.system))
            except psutil.Error:
                pass
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    finished = {int(k): v for k, v in json.loads(marks.read_text()).items()}
    latencies = []
    for step, at in finished.items():
        shown = next((when for when, s in seen if s >= step and when >= at), None)
        if shown is not None:
            latencies.append(shown - at)
    # Steady state: from 2 s in (imports done) to the end of the job.
    steady = [(w, c) for w, c in cpu if w >= cpu[0][0] + 2.0]
    if len(steady) < 2:
        steady = cpu
    (w0, c0), (w1, c1) = steady[0], steady[-1]
    return {
        "launcher_cpu_pct_of_one_core": 100.0 * (c1 - c0) / max(w1 - w0, 1e-9),
        "launcher_cpu_total_s": cpu[-1][1] if cpu else float("nan"),
        "frames_painted": float(len(seen)),
        "snapshots": float(len(finished)),
        "latency_median_s": statistics.median(latencies) if latencies else float("nan"),
        "latency_max_s": max(latencies) if latencies else float("nan"),
        "output_bytes": float(len(raw)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the job")
    parser.add_argument("--step-ms", type=float, default=5.0, help="busy time of one step")
    opts = parser.parse_args()
    result = run(opts.seconds, opts.step_ms)
    for key, value in result.items():
        print(f"{key:32s} {value:10.3f}")


if __name__ == "__main__":
    main()
