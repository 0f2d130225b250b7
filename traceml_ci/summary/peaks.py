"""Peak arithmetic rates of known GPUs, for MFU (model FLOPs utilisation)."""

from __future__ import annotations

#: Dense tensor-core peaks (TFLOP/s) by GPU name fragment and dtype, from the vendors' data
#: sheets (SXM parts; sparsity not counted). MFU = achieved / this. Matched in order, on the
#: lower-cased device name torch reports.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("h200", {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
    ("h100", {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
    ("a100", {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5}),
    ("l4", {"bfloat16": 121.0, "float16": 121.0, "float32": 30.3}),
    ("t4", {"float16": 65.0, "float32": 8.1}),
)


def peak_tflops(device_name: str | None, dtype: str | None) -> float | None:
    """The table's peak for this GPU and dtype; None for CPUs and GPUs not in the table."""
    if not device_name or not dtype:
        return None
    name = device_name.lower()
    for fragment, peaks in PEAK_TFLOPS:
        if fragment in name:
            return peaks.get(dtype)
    return None
