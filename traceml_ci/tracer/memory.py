"""Memory probes: process RSS (everywhere, time-gated) and per-step device peaks (CUDA)."""

from __future__ import annotations

from typing import Any

MB = 1024.0 * 1024.0

#: RSS is sampled at most this often: reading /proc costs ~10 us, a step may take 100 us.
RSS_INTERVAL_NS = 100_000_000
MAX_RSS_SAMPLES = 4096


class RssSampler:
    """(step, RSS MB) samples at most every ~100 ms; halves its resolution when full.

    Also the job's own memory: RSS when the sampler was made (the tracer's start) and the
    highest RSS seen since, so a job's peak can be told from what ran before it in the same
    process (a pytest session runs many tests in one process)."""

    __slots__ = ("_read", "last_ns", "samples", "interval_ns", "start_mb", "max_mb", "_hwm_start")

    def __init__(self, interval_ns: int = RSS_INTERVAL_NS) -> None:
        import psutil

        proc = psutil.Process()
        self._read = lambda: proc.memory_info().rss / MB
        self.last_ns = 0
        self.samples: list[tuple[int, float]] = []
        self.interval_ns = interval_ns
        self.start_mb: float = self._read()
        self.max_mb: float = self.start_mb
        self._hwm_start = _kernel_peak_mb()

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
        """Peak RSS: the kernel's high-water mark where available, else our samples."""
        peak = max((mb for _, mb in self.samples), default=None)
        kernel_peak = _kernel_peak_mb()
        if kernel_peak is None:
            return peak
        return max(peak or 0.0, kernel_peak)

    def job_peak_mb(self) -> float:
        """Peak RSS during the job above RSS at its start (MB, >= 0): the job's own memory.

        The highest sample, or the kernel's high-water mark when the job raised it (then it is
        exact; otherwise the process's earlier peak hides the job's, and the ~100 ms samples --
        one at the end included -- are all there is)."""
        peak = self.max_mb
        hwm = _kernel_peak_mb()
        if hwm is not None and self._hwm_start is not None and hwm > self._hwm_start:
            peak = max(peak, hwm)
        return max(peak - self.start_mb, 0.0)


def _kernel_peak_mb() -> float | None:
    """The process's lifetime peak RSS from getrusage, in MB; None where unavailable."""
    try:
        import resource
        import sys

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return None
    # Linux reports KiB, macOS bytes.
    return maxrss / MB if sys.platform == "darwin" else maxrss / 1024.0


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
