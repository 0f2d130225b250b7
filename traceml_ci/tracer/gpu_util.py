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
        #: Core temperatures (degrees C); empty where the device does not report one.
        self.temp_c: list[float] = []
        self.temp_slowdown_c = _slowdown_c(nvml, handle)
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
            temp = _temperature_c(nvml, self._handle)
            if temp is not None:
                self.temp_c.append(temp)
            if len(self.util) > MAX_SAMPLES:
                self.util = self.util[::2]
                self.mem_used_mb = self.mem_used_mb[::2]
                self.temp_c = self.temp_c[::2]

    def stop(self) -> GpuUtil:
        self._stop.set()
        self._thread.join(timeout=1.0)
        return summarize(self.util, self.mem_used_mb, self.temp_c, self.temp_slowdown_c)


def _temperature_c(nvml: Any, handle: Any) -> float | None:
    """The GPU's core temperature (NVML_TEMPERATURE_GPU), or None where it cannot be read."""
    try:
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        return float(nvml.nvmlDeviceGetTemperature(handle, sensor))
    except Exception:
        return None


def _slowdown_c(nvml: Any, handle: Any) -> float | None:
    """The temperature at which the driver slows the clocks, read once; None if unknown."""
    try:
        kind = getattr(nvml, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)
        return float(nvml.nvmlDeviceGetTemperatureThreshold(handle, kind))
    except Exception:
        return None


def summarize(
    util: list[float],
    mem_used_mb: list[float],
    temp_c: list[float] | None = None,
    temp_slowdown_c: float | None = None,
) -> GpuUtil:
    if not util:
        return GpuUtil()
    s = sorted(util)
    temps = temp_c or []
    return GpuUtil(
        util_mean_pct=sum(s) / len(s),
        util_p10_pct=percentile(s, 10),
        mem_used_peak_mb=max(mem_used_mb) if mem_used_mb else None,
        samples=len(s),
        temp_max_c=max(temps) if temps else None,
        temp_mean_c=sum(temps) / len(temps) if temps else None,
        temp_slowdown_c=temp_slowdown_c,
    )
