"""A few steps under torch.profiler, right after the warmup: a chrome trace and the top ops.

Built by ``Tracer`` only when ``TracerConfig.profile_steps > 0`` (the pytest plugin's
``--traceml-profile-on-regression`` re-run, or ``$TRACEML_CI_PROFILE_STEPS`` in a launched
child); otherwise this module is never imported, and nothing is added to the per-step path.
Step boundaries come from ``StepScope`` (``trace_step`` runs, the general way while profiling)
or, for a zero-change run, from a global optimizer step post-hook. Any error warns once and stops
profiling; training goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traceml_ci.summary.profile import (
    TOP_OPS_FILENAME,
    TRACE_FILENAME,
    profile_dir,
    top_ops,
    write_top_ops,
)

#: key_averages() rows that are not ops: the profiler's own per-step ranges ("ProfilerStep*").
_STEP_LABEL = "ProfilerStep"


class StepProfiler:
    """Profiles ``steps`` steps starting when ``warmup`` steps are done. ``boundary(n)`` is
    called between steps with the number of steps recorded so far; it returns True once the
    profile is written (or given up), when the caller may stop calling it."""

    def __init__(self, steps: int, warmup: int, out_dir: Path, warn: Callable[[str], None]) -> None:
        self.steps = int(steps)
        self.warmup = int(warmup)
        self.dir = profile_dir(out_dir)
        self._warn = warn
        self._prof: Any = None
        self._start_at = 0
        self._device = "cpu"
        self.done = False
        self._hook: Any = None
        self._seen = -1  # a step's end and the next one's start are one boundary

    # -- step boundaries -----------------------------------------------------------------
    def boundary(self, steps_total: int, device: Any = None) -> bool:
        if self.done or steps_total == self._seen:
            return self.done
        self._seen = steps_total
        try:
            if self._prof is None:
                if steps_total >= self.warmup:
                    self._start(steps_total, device)
            elif steps_total - self._start_at >= self.steps:
                self.close()
            else:
                self._prof.step()  # a ProfilerStep#N range per step (HTA reads them)
        except Exception as exc:
            self._give_up(exc)
        return self.done

    def follow_optimizer(self, steps_total: Callable[[], int], device: Callable[[], Any],
                         explicit: Callable[[], bool]) -> None:
        """Zero-change runs: step boundaries at optimizer steps (a global post-hook, removed
        when the profile is done), until the script calls trace_step (``explicit()``)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def hook(_opt: Any, _args: Any, _kwargs: Any) -> None:
            if not explicit() and self.boundary(steps_total(), device()):
                self._unhook()

        self._hook = register_optimizer_step_post_hook(hook)

    def _start(self, steps_total: int, device: Any) -> None:
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        kind = getattr(device, "type", None) or "cpu"
        if kind == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._device = str(kind)
        # A schedule that always records: the profiler then marks each step (ProfilerStep#N).
        prof = profile(activities=activities, schedule=_always_record(ProfilerAction.RECORD))
        prof.start()
        self._prof = prof
        self._start_at = steps_total

    # -- the end -------------------------------------------------------------------------
    def close(self, steps_total: int | None = None) -> None:
        """Stop and write the trace and the top ops (at the last profiled step, or at finish
        with fewer steps). Without a profiled step nothing is written, with a warning."""
        if self.done:
            return
        self.done = True
        self._unhook()
        prof, self._prof = self._prof, None
        try:
            if prof is None:
                self._warn(f"no step was profiled ({self.warmup} warmup step(s) first; the run "
                           "ended before)")
                return
            prof.stop()
            ran = self.steps if steps_total is None else max(1, steps_total - self._start_at)
            self._write(prof, min(ran, self.steps))
        except Exception as exc:
            self._give_up(exc)

    def _write(self, prof: Any, steps: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        trace = self.dir / TRACE_FILENAME
        tmp = self.dir / f".{TRACE_FILENAME}.{os.getpid()}.tmp"
        try:
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, trace)  # a reader never sees half a trace
        finally:
            tmp.unlink(missing_ok=True)
        rows = []
        for e in prof.key_averages():
            # Ops only: a kernel's row (device_type CUDA) repeats device time its op counts.
            if e.key.startswith(_STEP_LABEL) or _kind(e) != "CPU":
                continue
            dev = getattr(e, "self_device_time_total", 0.0) if self._device != "cpu" else None
            rows.append((e.key, e.self_cpu_time_total / 1000.0,
                         None if dev is None else dev / 1000.0, e.count))
        write_top_ops(self.dir / TOP_OPS_FILENAME, top_ops(rows, steps=steps, device=self._device))

    def _give_up(self, exc: BaseException) -> None:
        self.done = True
        self._unhook()
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass
        self._warn(f"profiling stopped after an error ({exc!r}); training goes on")

    def _unhook(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()


def _always_record(action: Any) -> Callable[[int], Any]:
    return lambda _step: action


def _kind(event: Any) -> str:
    """``DeviceType.CPU`` -> "CPU" (events without the attribute count as host ops)."""
    return str(getattr(event, "device_type", "CPU")).rsplit(".", 1)[-1]
