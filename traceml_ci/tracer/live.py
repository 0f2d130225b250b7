"""The live snapshot writer: a daemon thread rewriting ``<out>/live/rank<N>.json`` as a run goes."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceml_ci.summary.build import RunRecord, build_summary
from traceml_ci.summary.live import (
    HISTORY_POINTS,
    RUNNING,
    SNAPSHOT_INTERVAL_S,
    WINDOW_STEPS,
    snapshot_from_summary,
    snapshot_path,
)
from traceml_ci.summary.thresholds import Thresholds
from traceml_ci.tracer.identity import Identity
from traceml_ci.tracer.memory import MB, RssSampler
from traceml_ci.tracer.steps import ALLOC_COL, RESERVED_COL, STEP, StepStore

#: Seconds of (time, steps) pairs that steps_per_s is measured over: smoother than one interval.
RATE_SPAN_S = 5.0
#: Seconds between refreshes of the memory part of a snapshot (growth, memory diagnosis).
MEMORY_EVERY_S = 5.0
#: How long finish waits for the thread (it may be inside a snapshot, or a slow write).
JOIN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Window:
    """Rows of the step columns copied for one snapshot: what the run's record is built over."""

    #: One list per column of ``StepColumns`` (times in ms), oldest row first.
    cols: list[list[float]]
    #: The stride the rows were kept at (``StepColumns.stride``).
    stride: int
    #: ``steps_total`` when the rows were copied.
    steps: int
    #: With the memory part (device peaks, RSS samples): its growth slope costs a few ms.
    memory: bool = True


class LiveWriter:
    """Snapshots of one run's recent steps. Reads the step store without locks and without
    touching the per-step path: it copies the newest rows of the preallocated columns (one
    slice per column, atomic under the GIL) and hands them to ``record``, the tracer's one
    ``RunRecord`` builder, which reads only plain fields for a window.

    ``snapshot()`` is the whole job of one tick; the thread calls it every ``interval_s``, and
    ``close()`` writes a last one with how the run ended. Any error in the thread warns once
    (``warn``) and stops the thread; training never sees it."""

    def __init__(
        self,
        record: Callable[[Window], RunRecord],
        identity: Identity,
        store: StepStore,
        rss: RssSampler | None,
        out_dir: Path,
        thresholds: Thresholds,
        warn: Callable[[str], None],
        interval_s: float | None = None,
    ) -> None:
        import psutil

        self._record = record
        self.store = store
        self.rss = rss
        #: The tracer sets it again when a later init() changes them.
        self.thresholds = thresholds
        self._warn = warn
        self.interval_s = SNAPSHOT_INTERVAL_S if interval_s is None else interval_s
        self._rank = identity.rank
        # Absolute now: a script that changes its working folder keeps one snapshot file.
        self.path: Path = snapshot_path(Path(out_dir).absolute(), self._rank)
        #: Folders that did not exist yet (the snapshot's writes make them): a retarget removes
        #: them again if empty, so a folder the run moved away from is not left behind.
        self._made = [d for d in (self.path.parent, self.path.parent.parent) if not d.exists()]
        self._stop = threading.Event()
        #: Held around each write: once closed, the thread writes nothing more (a late tick
        #: must never overwrite the final snapshot).
        self._lock = threading.Lock()
        self._closed = False
        self._failed = False
        self._proc = psutil.Process()
        self._identity = identity.snapshot_fields()
        self._history: deque[float] = deque(maxlen=HISTORY_POINTS)
        self._rates: deque[tuple[float, int]] = deque()
        self._history_at = -1  # steps_total when history last got a point
        self._steps_seen = 0  # steps_total at the previous snapshot ...
        self._last_step_at: float | None = None  # ... and when it last grew
        #: The memory part (growth slope, memory diagnosis) is refreshed every MEMORY_EVERY_S:
        #: its Theil-Sen slope over the run's RSS samples costs a few ms; shares are cheap.
        self._memory_at = -float("inf")
        self._memory: tuple[Any, Any, Any] = (None, None, None)
        self.first_window_pct: dict[str, float | None] | None = None
        self._thread = threading.Thread(target=self._run, name="traceml-ci-live", daemon=True)

    # -- thread --------------------------------------------------------------------------
    def start(self) -> LiveWriter:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while True:
                self._write(self.snapshot())
                if self._stop.wait(self.interval_s):
                    return
        except Exception as exc:
            self._failed = True
            self._warn(f"the live snapshot stopped after an internal error ({exc!r}); "
                       "training goes on")

    def _write(self, doc: dict[str, Any], final: bool = False) -> None:
        data = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode("utf-8")
        with self._lock:
            if self._closed:
                return
            if final:
                self._closed = True
            _replace_file(self.path, data)

    def stop(self) -> None:
        """Stop the thread (no final snapshot): before finish's last reads, or a forgotten
        tracer. Waits a short while at most."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)

    def discard(self) -> None:
        """Stop and remove the snapshot (``init(live=False)`` after the tracer started)."""
        self.stop()
        with self._lock:
            self._closed = True
            try:
                self.path.unlink()
            except OSError:
                pass

    def retarget(self, out_dir: Path) -> None:
        """A later init() moved the output folder: snapshots go there, the old one goes."""
        new = snapshot_path(Path(out_dir).absolute(), self._rank)
        with self._lock:
            if new == self.path:
                return
            old, self.path = self.path, new
            try:
                old.unlink()
            except OSError:
                pass
            made, self._made = self._made, []
            for folder in made:  # the live folder, then the output folder, if we made them
                try:
                    folder.rmdir()
                except OSError:  # not empty (something else lives there), or gone
                    break

    def close(self, status: str, summary_path: str | None) -> None:
        """At finish (after the summary is written): stop the thread, write the last snapshot
        with the run's ``status`` and where its summary went."""
        self.stop()
        if self._closed:
            return
        try:
            self._write(self.snapshot(status=status, summary_path=summary_path), final=True)
        except Exception as exc:
            if not self._failed:
                self._failed = True
                self._warn(f"could not write the last live snapshot ({exc!r})")

    # -- one snapshot ------------------------------------------------------------------------
    def snapshot(self, status: str = RUNNING, summary_path: str | None = None) -> dict[str, Any]:
        """The snapshot of the run's newest ``WINDOW_STEPS`` analysed rows, as of now."""
        store = self.store
        now = time.time()
        steps = store.steps_total
        cols, stride = _rows(store, WINDOW_STEPS)
        # While the growth is unknown (few samples yet) it is cheap: refresh it every time.
        full_memory = (status != RUNNING or self._memory[0] is None
                       or now - self._memory_at >= MEMORY_EVERY_S)
        record = self._record(Window(cols, stride, steps, memory=full_memory))
        window = build_summary(record, self.thresholds)
        doc = window.to_dict()

        if self.first_window_pct is None:
            self.first_window_pct = self._first_window(store)
        median = doc["step_time"]["step_ms"].get("median")
        if median is not None and steps != self._history_at:  # a stalled run adds no points
            self._history_at = steps
            self._history.append(median)

        if steps != self._steps_seen:
            self._steps_seen, self._last_step_at = steps, now
        on_device = store.cuda_memory is not None and bool(cols[STEP])
        # Past the cap the job goes on untraced: its rate is unknown, not zero.
        capped = store.max_steps is not None and steps >= store.max_steps
        snap = snapshot_from_summary(
            doc,
            steps_done=steps,
            steps_per_s=None if capped else self._rate(now, steps),
            history_ms=list(self._history),
            first_window_pct=_rounded(self.first_window_pct),
            memory={
                "rss_mb": self._rss_mb(),
                "allocated_mb": cols[ALLOC_COL][-1] if on_device else None,
                "reserved_mb": cols[RESERVED_COL][-1] if on_device else None,
            },
            identity={**self._identity, "run_name": window.run.name,
                      "started_at": window.run.started_at},
            status=status,
            heartbeat=now,
            summary_path=summary_path,
            max_steps=store.max_steps,
            last_step_at=self._last_step_at,
        )
        if full_memory:
            self._memory_at = now
            mem = doc["step_memory"]
            self._memory = (mem.get("growth_mb_per_1k_steps"), mem.get("growth_basis"),
                            snap["memory_diagnosis"])
        growth, basis, snap["memory_diagnosis"] = self._memory
        snap["memory"].update(growth_mb_per_1k_steps=growth, growth_basis=basis)
        return snap

    def _first_window(self, store: StepStore) -> dict[str, float | None] | None:
        """The shares of the first full window after warmup (rows 0..WINDOW_STEPS), once."""
        columns = store.columns
        if columns.n < WINDOW_STEPS:
            return None
        cols, stride = _rows(store, WINDOW_STEPS, newest=False)
        record = self._record(Window(cols, stride, store.steps_total, memory=False))
        st = build_summary(record, self.thresholds).step_time
        return dict(st.pct)  # the run's own phases: with ``wait`` under a process group

    def _rss_mb(self) -> float:
        """RSS now: the tracer's newest sample (taken at a step's end, at most ~100 ms apart)
        while it is fresh, which costs no system call; else a read of our own."""
        rss = self.rss
        if rss is not None and rss.samples and time.perf_counter_ns() - rss.last_ns < 1e9:
            return rss.samples[-1][1]
        return self._proc.memory_info().rss / MB

    def _rate(self, now: float, steps: int) -> float | None:
        """Steps per second over the last ~RATE_SPAN_S of snapshots, from the first one that
        saw a step (the script's set-up before its loop is not a slow step)."""
        rates = self._rates
        if steps == 0:
            return None
        rates.append((now, steps))
        while len(rates) > 2 and now - rates[1][0] >= RATE_SPAN_S:
            rates.popleft()
        t0, s0 = rates[0]
        return (steps - s0) / (now - t0) if now > t0 else None


def _rows(store: StepStore, k: int, newest: bool = True) -> tuple[list[list[float]], int]:
    """The newest (or, ``newest=False``, the first) ``k`` rows of every column, in ms, and the
    stride they were kept at.

    No lock: each slice is one C call under the GIL, and rows below ``n`` are complete (the
    store bumps ``n`` after a row's last value). Only a halving (``StepColumns._halve``, once
    per 100k rows) moves rows, and it never writes above the new ``n``: slices taken across one
    still hold the old rows, consistent with the old stride. Reading the stride on both sides
    tells; we then read again."""
    columns = store.columns
    for _ in range(3):
        stride = columns.stride
        host = store.host
        n = columns.n
        lo, hi = (max(0, n - k), n) if newest else (0, min(k, n))
        cols = [c[lo:hi].tolist() for c in columns.cols]
        if columns.stride == stride and columns.n >= n:  # n only shrinks by a halving
            break
    if host:  # host rows hold nanoseconds (see StepStore.host_step)
        for i in range(ALLOC_COL):
            cols[i] = [v / 1e6 for v in cols[i]]
    return cols, stride


def _replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path`` and rename it over ``path``: readers see
    the old snapshot or the new one, never a torn one.

    Not ``fsutil.atomic_write_text``: a snapshot is rewritten twice a second and worthless
    after a reboot, so no fsync; and each system call lets the GIL go, which a training thread
    spinning in Python may wait a scheduler slice to get back on a busy machine -- so as few
    calls as can be (the kernel applies the umask to O_CREAT's mode; no chmod, no mkstemp)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one writer per process (lock)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o666)
    except FileNotFoundError:  # the first snapshot, or the folder was removed meanwhile
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, flags, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _rounded(pct: dict[str, float | None] | None) -> dict[str, float | None] | None:
    if pct is None:
        return None
    return {p: None if v is None else round(v, 2) for p, v in pct.items()}
