"""Memory probes: process RSS (everywhere, time-gated) and per-step device peaks (CUDA)."""

from __future__ import annotations

from typing import Any

MB = 1024.0 * 1024.0

#: RSS is sampled at most this often: reading /proc costs ~10 us, a step may take 100 us.
RSS_INTERVAL_NS = 100_000_000
MAX_RSS_SAMPLES = 4096


class RssSampler:
    """(step, RSS MB) samples at most every ~100 ms; halves its resolution when full.

    Also the job's own memory: RSS when the sampler was made (the tracer's start) and the peak
    since, so a job's memory can be told from what ran before it in the same process (a pytest
    session runs many tests in one process)."""

    __slots__ = ("_read", "last_ns", "samples", "interval_ns", "start_mb", "max_mb", "_hwm_reset")

    def __init__(self, interval_ns: int = RSS_INTERVAL_NS) -> None:
        import psutil

        proc = psutil.Process()
        self._read = lambda: proc.memory_info().rss / MB
        self.last_ns = 0
        self.samples: list[tuple[int, float]] = []
        self.interval_ns = interval_ns
        # Reset the kernel's high-water mark first, so that it measures this job alone.
        self._hwm_reset = reset_high_water_mark()
        self.start_mb: float = self._read()
        self.max_mb: float = self.start_mb

    def maybe_sample(self, step: int, now_ns: int) -> None:
        if now_ns - self.last_ns < self.interval_ns:
            return
        self.last_ns = now_ns
        self.sample(step)

    def sample(self, step: int) -> None:
        mb = self._read()
        self.samples.append((step, mb))
        if mb > self.max_mb:
            self.max_mb = mb
        if len(self.samples) > MAX_RSS_SAMPLES:
            self.samples = self.samples[::2]

    def peak_mb(self) -> float | None:
        """The process's lifetime peak RSS: the kernel's high-water mark (with the peaks from
        before any reset) where available, else our samples."""
        peak = max((mb for _, mb in self.samples), default=None)
        kernel_peak = lifetime_peak_mb()
        if kernel_peak is None:
            return peak
        return max(peak or 0.0, kernel_peak)

    def job_peak_mb(self) -> float:
        """Peak RSS during the job above RSS at its start (MB, >= 0): the job's own memory.

        Exact where the kernel's high-water mark could be reset at the start (Linux:
        /proc/self/clear_refs); elsewhere the highest ~100 ms sample (one at the end included),
        which can miss a short spike -- the same way whatever ran before."""
        peak = self.max_mb
        if self._hwm_reset:
            hwm = _status_hwm_mb()
            if hwm is not None:
                peak = max(peak, hwm)
        return max(peak - self.start_mb, 0.0)


#: The process's highest peak RSS before the last reset of the kernel's high-water mark (MB).
_peak_before_resets = 0.0


def reset_high_water_mark() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS; False where that cannot be
    done. The peak so far is kept in ``_peak_before_resets``, so ``lifetime_peak_mb`` still
    answers for the whole process (``getrusage``'s ``ru_maxrss`` follows the reset on Linux)."""
    global _peak_before_resets
    before = lifetime_peak_mb()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # 5: reset the peak resident set size (Linux >= 4.0)
    except OSError:
        return False
    _peak_before_resets = max(_peak_before_resets, before or 0.0)
    return True


def lifetime_peak_mb() -> float | None:
    """The process's peak RSS since it started, in MB; None where unavailable."""
    try:
        import resource
        import sys

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return _peak_before_resets or None
    # Linux reports KiB, macOS bytes.
    now = maxrss / MB if sys.platform == "darwin" else maxrss / 1024.0
    return max(now, _peak_before_resets)


def _status_hwm_mb() -> float | None:
    """VmHWM from /proc/self/status: the peak RSS since the last reset, in MB."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def system_total_mb() -> float | None:
    try:
        import psutil

        return psutil.virtual_memory().total / MB
    except Exception:
        return None


class CudaMemory:
    """Per-step peak allocated/reserved on one CUDA device, reset after each read.

    Reads the allocator's counters on the host: no device synchronisation.
    """

    def __init__(self, torch: Any, device_index: int) -> None:
        self._torch = torch
        self.index = device_index
        cuda = torch.cuda
        raw = getattr(torch._C, "_cuda_memoryStats", None)
        # The raw nested dict is ~10x cheaper than the flattened public memory_stats().
        if raw is not None:
            self._stats = lambda: raw(device_index)
        else:  # pragma: no cover - older/newer torch without the private binding
            self._stats = lambda: _nest(cuda.memory_stats(device_index))
        self._reset = lambda: cuda.reset_peak_memory_stats(device_index)
        self._reset()

    def read_and_reset(self) -> tuple[float, float]:
        s = self._stats()
        self._reset()
        return s["allocated_bytes"]["all"]["peak"] / MB, s["reserved_bytes"]["all"]["peak"] / MB

    def counters(self) -> tuple[int, int]:
        """(allocation retries, OOMs) since the process started."""
        s = self._stats()
        return int(s.get("num_alloc_retries", 0)), int(s.get("num_ooms", 0))

    def total_mb(self) -> float:
        return self._torch.cuda.get_device_properties(self.index).total_memory / MB


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """Turn memory_stats()'s "a.b.c" keys into the raw nested layout."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out
