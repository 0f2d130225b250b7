"""GPU utilisation via NVML (nvidia-ml-py, optional extra ``[gpu]``) on a background thread.

No NVIDIA GPU or no pynvml: the sampler is simply not started; fields stay null, silently.
"""

from __future__ import annotations

import threading
from typing import Any

from traceml_ci.summary.model import GpuUtil
from traceml_ci.summary.stats import percentile

SAMPLE_INTERVAL_S = 0.2
MAX_SAMPLES = 18_000  # one hour at 5 Hz; older samples are thinned


class GpuUtilSampler:
    def __init__(self, handle: Any, nvml: Any, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._nvml = nvml
        self._handle = handle
        self._interval = interval_s
        self._stop = threading.Event()
        self.util: list[float] = []
        self.mem_used_mb: list[float] = []
        self._thread = threading.Thread(target=self._run, name="traceml-ci-nvml", daemon=True)

    @classmethod
    def start_for(cls, device_index: int, uuid: str | None = None) -> GpuUtilSampler | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = None
            if uuid:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                except Exception:
                    handle = None
            if handle is None:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:
            return None
        sampler = cls(handle, pynvml)
        sampler._thread.start()
        return sampler

    def _run(self) -> None:
        nvml = self._nvml
        while not self._stop.wait(self._interval):
            try:
                self.util.append(float(nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
                self.mem_used_mb.append(nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20)
            except Exception:
                return  # the GPU went away or NVML failed: keep what we have
            if len(self.util) > MAX_SAMPLES:
                self.util = self.util[::2]
                self.mem_used_mb = self.mem_used_mb[::2]

    def stop(self) -> GpuUtil:
        self._stop.set()
        self._thread.join(timeout=1.0)
        return summarize(self.util, self.mem_used_mb)


def summarize(util: list[float], mem_used_mb: list[float]) -> GpuUtil:
    if not util:
        return GpuUtil()
    s = sorted(util)
    return GpuUtil(
        util_mean_pct=sum(s) / len(s),
        util_p10_pct=percentile(s, 10),
        mem_used_peak_mb=max(mem_used_mb) if mem_used_mb else None,
        samples=len(s),
    )
