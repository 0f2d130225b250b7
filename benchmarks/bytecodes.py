"""Shared by the overhead benchmarks: Python bytecodes run per step, a load-independent view of
the tracer's cost (its own code is pure Python; torch's C++ does not count)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def count_bytecodes(run: Callable[[int], Any], steps: int, warm: int) -> float:
    """Bytecodes that ``run(steps)`` executes per step (``sys.settrace`` opcode events), after
    ``run(warm)`` untraced: caches warm and lazy set-up done, so only the steady state counts."""
    counted = [0]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counted[0] += 1
        return trace

    run(warm)
    sys.settrace(trace)
    try:
        run(steps)
    finally:
        sys.settrace(None)
    return counted[0] / steps
