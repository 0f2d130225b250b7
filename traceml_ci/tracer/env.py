"""The environment fingerprint: what the gate needs to tell comparable runs from others."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo), else the machine type.

    platform.processor() would spawn `uname -p`, which costs more and says less.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.machine() or None


def fingerprint(device: Any = None) -> dict[str, Any]:
    """python, torch, cuda, device type/name, GPU count, CPU count, torch threads, platform."""
    import torch

    cuda_ok = torch.cuda.is_available()
    device_type = getattr(device, "type", None) or "cpu"
    device_name: str | None = cpu_model()
    if device_type == "cuda" and cuda_ok:
        index = device.index if getattr(device, "index", None) is not None else 0
        device_name = torch.cuda.get_device_name(index)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_type": device_type,
        "device_name": device_name,
        "gpu_count": torch.cuda.device_count() if cuda_ok else 0,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
