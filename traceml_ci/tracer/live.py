"""The live snapshot writer: a daemon thread rewriting ``<out>/live/rank<N>.json`` as a run goes."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traceml_ci.summary.build import MEASURED_PHASES, RunRecord, StepSeries, build_summary
from traceml_ci.summary.keys import PHASES
from traceml_ci.summary.live import (
    HISTORY_POINTS,
    RUNNING,
    SNAPSHOT_INTERVAL_S,
    WINDOW_STEPS,
    snapshot_from_summary,
    snapshot_path,
)
from traceml_ci.summary.model import GpuUtil, RunInfo, RunStatus
from traceml_ci.tracer.gpu_util import summarize as summarize_gpu
from traceml_ci.tracer.memory import MB, system_total_mb
from traceml_ci.tracer.steps import ALLOC_COL, RESERVED_COL, STEP

#: Seconds of (time, steps) pairs that steps_per_s is measured over: smoother than one interval.
RATE_SPAN_S = 5.0
#: GPU utilisation samples (NVML, ~5 per second) averaged for the snapshot: the last ~5 s.
GPU_RECENT_SAMPLES = 25
#: Seconds between refreshes of the memory part of a snapshot (growth, memory diagnosis).
MEMORY_EVERY_S = 5.0
#: How long finish waits for the thread (it may be inside a snapshot, or a slow write).
JOIN_TIMEOUT_S = 1.0


class LiveWriter:
    """Snapshots of one tracer's recent steps. Reads the tracer's store without locks and
    without touching the per-step path: it copies the newest rows of the preallocated columns
    (one slice per column, atomic under the GIL) and the tracer's few plain fields.

    ``snapshot()`` is the whole job of one tick; the thread calls it every ``interval_s``, and
    ``close()`` writes a last one with how the run ended. Any error in the thread warns once
    (``warn``) and stops the thread; training never sees it."""

    def __init__(
        self,
        tracer: Any,
        warn: Callable[[str], None],
        interval_s: float | None = None,
    ) -> None:
        import psutil

        # session imports this module at its top: borrow its helpers once the tracer exists.
        from traceml_ci.tracer.session import _default_run_name, _env_int

        self._run_name = _default_run_name
        self.tracer = tracer
        self._warn = warn
        self.interval_s = SNAPSHOT_INTERVAL_S if interval_s is None else interval_s
        rank = _env_int("RANK", 0)
        # Absolute now: a script that changes its working folder keeps one snapshot file.
        self.path: Path = snapshot_path(Path(tracer.config.out_dir).absolute(), rank)
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
        self._system_total_mb = system_total_mb()
        self._device_total_mb: float | None = None
        self._identity = {
            "rank": rank,
            "local_rank": _env_int("LOCAL_RANK", 0),
            "world_size": _env_int("WORLD_SIZE", 1),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": _iso(tracer.started_at),
        }
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
        new = snapshot_path(Path(out_dir).absolute(), self._identity["rank"])
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
        """The snapshot of the tracer's newest ``WINDOW_STEPS`` analysed rows, as of now."""
        tracer = self.tracer
        store = tracer.store
        now = time.time()
        steps = store.steps_total
        cols, stride = _rows(store, WINDOW_STEPS)
        # While the growth is unknown (few samples yet) it is cheap: refresh it every time.
        full_memory = (status != RUNNING or self._memory[0] is None
                       or now - self._memory_at >= MEMORY_EVERY_S)
        record = self._record(cols, stride, steps, memory=full_memory)
        window = build_summary(record, tracer.config.thresholds)
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
            identity={**self._identity, "run_name": window.run.name},
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

    def _record(
        self, cols: list[list[float]], stride: int, steps: int, memory: bool = True
    ) -> RunRecord:
        """The RunRecord of a window: the final summary's, over the given rows only.
        ``memory=False`` leaves out what only the memory part reads (the costly slope)."""
        tracer = self.tracer
        store = tracer.store
        on_device = store.cuda_memory is not None
        rss = tracer.rss
        warmup = store.warmup_steps
        if on_device and self._device_total_mb is None:
            self._device_total_mb = store.cuda_memory.total_mb()
        device = tracer.device
        return RunRecord(
            run=RunInfo(
                name=tracer.config.run_name or self._run_name(),
                status=RunStatus.COMPLETED,  # not read: the snapshot carries its own status
                started_at=self._identity["started_at"],
                duration_s=time.perf_counter() - tracer._t0,
                mode=tracer.config.mode,
                rank=self._identity["rank"],
                world_size=self._identity["world_size"],
            ),
            env={},
            clock=store.clock.kind,
            steps_total=steps,
            warmup_steps=min(warmup, steps),
            series=StepSeries(
                step_ms=cols[STEP],
                phase_ms={p: cols[1 + i] for i, p in enumerate(MEASURED_PHASES)},
                stride=stride,
                allocated_mb=cols[ALLOC_COL] if on_device and memory else None,
                reserved_mb=cols[RESERVED_COL] if on_device and memory else None,
            ),
            batch_size=tracer.batch_size,
            samples_per_step=tracer._samples_per_step(),
            dataloader=tracer._dataloader_settings(),
            memory_device=str(device) if device is not None else "cpu",
            # Growth over the run so far (a list copy is atomic; the sampler rebinds, never
            # edits in place, when it thins).
            rss_samples=[(s, mb) for s, mb in list(rss.samples) if s > warmup]
            if rss and memory else (),
            peak_rss_mb=rss.peak_mb() if rss and memory else None,
            system_total_mb=self._system_total_mb,
            device_total_mb=self._device_total_mb,
            gpu=self._gpu(),
        )

    def _first_window(self, store: Any) -> dict[str, float | None] | None:
        """The shares of the first full window after warmup (rows 0..WINDOW_STEPS), once."""
        columns = store.columns
        if columns.n < WINDOW_STEPS:
            return None
        cols, stride = _rows(store, WINDOW_STEPS, newest=False)
        record = self._record(cols, stride, store.steps_total, memory=False)
        st = build_summary(record, self.tracer.config.thresholds).step_time
        return {p: st.pct.get(p) for p in PHASES}

    def _rss_mb(self) -> float:
        """RSS now: the tracer's newest sample (taken at a step's end, at most ~100 ms apart)
        while it is fresh, which costs no system call; else a read of our own."""
        rss = self.tracer.rss
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

    def _gpu(self) -> GpuUtil:
        sampler = self.tracer._gpu_sampler
        if sampler is None:
            return GpuUtil()
        return summarize_gpu(list(sampler.util[-GPU_RECENT_SAMPLES:]),
                             list(sampler.mem_used_mb[-GPU_RECENT_SAMPLES:]))


def _rows(store: Any, k: int, newest: bool = True) -> tuple[list[list[float]], int]:
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


def _iso(dt: Any) -> str:
    return dt.isoformat(timespec="seconds").replace("+00:00", "Z")


