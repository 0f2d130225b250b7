"""How contended the CPU was during a run: read twice (start and finish), never per step.

A loaded runner stretches compute phases and not sleeps, so it moves phase shares. Rather than
guess that from the shares, each run records what the kernel saw:

- ``runqueue_wait_pct``: time the main thread was runnable but waiting for a CPU, in percent of
  wall time (``/proc/self/task/<pid>/schedstat``, Linux with schedstats; null elsewhere);
- ``involuntary_switches_per_s``: the process's involuntary context switches per second
  (``getrusage``'s ``ru_nivcsw``; null where there is no ``resource`` module);
- ``load_per_cpu``: the 1-minute load average per CPU at finish (null where unknown);
- ``cpu_steal_pct``: time the hypervisor gave the machine's CPUs to someone else, in percent of
  all CPU time (``/proc/stat``; null elsewhere).

Torch-free, and it never raises: a figure it cannot read is None.

``ThreadWait`` reads the same runqueue wait for whichever thread calls it, a few microseconds a
read: the module sampler brackets a sampled step's forward and backward with it, and leaves out
a sample whose thread was preempted inside (tracer/modules.py).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from traceml_ci.summary.model import Contention


def schedstat(pid: int) -> tuple[int, int] | None:
    """(ns on CPU, ns runnable but waiting) of the thread ``pid`` (the main thread's id is the
    process id); None without schedstats."""
    for path in (f"/proc/self/task/{pid}/schedstat", "/proc/self/schedstat"):
        try:
            with open(path, encoding="ascii") as f:
                fields = f.read().split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return None


class ThreadWait:
    """``read()``: ns the calling thread has waited runnable for a CPU so far, or None (no
    schedstats). One open file per thread, read with ``pread`` (~5 µs; opening it is ~40 µs)."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}
        self.available = schedstat(threading.get_native_id()) is not None

    def read(self) -> int | None:
        if not self.available:
            return None
        tid = threading.get_native_id()
        fd = self._fds.get(tid)
        try:
            if fd is None:
                fd = self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            return int(os.pread(fd, 96, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass


def _involuntary_switches() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    try:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)
    except (OSError, ValueError):
        return None


def _cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            first = f.readline().split()
        if first[:1] != ["cpu"]:
            return None
        # user nice system idle iowait irq softirq steal [guest guest_nice]: guests are
        # already counted in user and nice
        values = [int(v) for v in first[1:9]]
        return (values[7] if len(values) > 7 else 0), sum(values)
    except (OSError, ValueError, IndexError):
        return None


def _load_per_cpu() -> float | None:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None


@dataclass(frozen=True)
class _Snapshot:
    wall_ns: int
    sched: tuple[int, int] | None
    nivcsw: int | None
    cpu: tuple[int, int] | None


def _snapshot(pid: int) -> _Snapshot:
    return _Snapshot(time.perf_counter_ns(), schedstat(pid), _involuntary_switches(),
                     _cpu_times())


class ContentionProbe:
    """Started once (where tracing starts), read once (at finish): the contention in between."""

    def __init__(self) -> None:
        # The main thread's id is the process id; record it now, in case finish runs elsewhere.
        self._pid = os.getpid()
        self._start = _snapshot(self._pid)

    def read(self) -> Contention:
        """The contention since the probe started (figures it cannot read are None)."""
        start, end = self._start, _snapshot(self._pid)
        wall_ns = end.wall_ns - start.wall_ns
        wait_pct = switches = steal = None
        if wall_ns > 0 and start.sched is not None and end.sched is not None:
            wait_pct = 100.0 * max(end.sched[1] - start.sched[1], 0) / wall_ns
        if wall_ns > 0 and start.nivcsw is not None and end.nivcsw is not None:
            switches = max(end.nivcsw - start.nivcsw, 0) / (wall_ns / 1e9)
        if start.cpu is not None and end.cpu is not None and end.cpu[1] > start.cpu[1]:
            steal = 100.0 * max(end.cpu[0] - start.cpu[0], 0) / (end.cpu[1] - start.cpu[1])
        return Contention(
            runqueue_wait_pct=None if wait_pct is None else min(wait_pct, 100.0),
            involuntary_switches_per_s=switches,
            load_per_cpu=_load_per_cpu(),
            cpu_steal_pct=steal,
        )


def start_probe() -> ContentionProbe | None:
    """A started probe, or None if even that failed (the tracer never raises)."""
    try:
        return ContentionProbe()
    except Exception:
        return None


def read_probe(probe: ContentionProbe | None) -> Contention | None:
    """The probe's reading, or None (no probe, or reading failed)."""
    if probe is None:
        return None
    try:
        return probe.read()
    except Exception:
        return None
