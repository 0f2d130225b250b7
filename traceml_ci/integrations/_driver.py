"""What every framework callback does: join or start the tracer, open and close steps, finish."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceml_ci.summary.model import RunStatus
from traceml_ci.tracer import api
from traceml_ci.tracer.config import RunOptions, given_options
from traceml_ci.tracer.warn import warn

if TYPE_CHECKING:
    from typing_extensions import Unpack

#: ``log_to`` names and the modules whose ``log_summary`` they call.
LOG_TARGETS = {"mlflow": "traceml_ci.integrations.mlflow", "wandb": "traceml_ci.integrations.wandb"}


class StepDriver:
    """Drives ``trace_step`` from a framework's hooks instead of a ``with`` block.

    A callback cannot wrap the loop body, so it enters the step's scope in one hook and exits it
    in another. Everything else (phases, clocks, the summary) is the tracer's auto mode: the
    callback only says where a step begins and ends and which model's forward is the forward.
    Like the tracer, it never raises into the training loop.
    """

    def __init__(
        self, *, log_to: tuple[str, ...] | list[str] = (), caller: str = "StepDriver",
        **options: Unpack[RunOptions],
    ) -> None:
        self.options = given_options(options, RunOptions, caller)
        unknown = sorted(set(log_to) - set(LOG_TARGETS))
        if unknown:
            raise ValueError(f"log_to: unknown {unknown}; choose from {sorted(LOG_TARGETS)}")
        #: Where the summary is also logged at train end ("mlflow", "wandb"): into the run the
        #: framework's own MLflow / W&B integration has open, else a new one.
        self.log_to = tuple(log_to)
        self.scope: Any = None
        self._broken = False
        #: When the last step closed, and when an evaluation began (perf_counter_ns).
        self._closed_ns: int | None = None
        self._eval_ns: int | None = None

    @property
    def in_step(self) -> bool:
        return self.scope is not None

    def start(self) -> None:
        """Join the process's tracer (``traceml-ci run``, or the script's own ``init()``), or
        start one with this callback's options. Call it before the optimizer is built: the
        tracer then times its steps without torch's global hooks."""
        try:
            tracer = api.current()
            if tracer is None or tracer.summary is not None:
                api.init(**self.options)
            elif self.options and not tracer.store.steps_total:
                api.init(**self.options)  # not yet recording: the callback's options apply
            tracer = api.current()
            if tracer is not None:
                tracer.eval_hooks = True  # evaluations are reported: none noted, none ran
        except Exception as exc:
            self._fail(exc)

    def open(self, models: tuple[Any, ...]) -> None:
        """A step begins; ``models``: whose outermost forward is the forward phase."""
        if self.scope is not None or self._broken:
            return
        try:
            scope = api.trace_step(*models)
            scope.__enter__()
            self.scope = scope
        except Exception as exc:
            self._fail(exc)

    def close(self, ok: bool = True) -> None:
        """The step ends; ``ok=False`` drops it (the training loop raised)."""
        scope, self.scope = self.scope, None
        if scope is None:
            return
        try:
            self._closed_ns = time.perf_counter_ns()
            if ok:
                scope.__exit__(None, None, None)
            else:
                scope.__exit__(RuntimeError, None, None)
        except Exception as exc:
            self._fail(exc)

    def eval_begin(self) -> None:
        """An evaluation begins (Lightning's ``on_validation_start``)."""
        self._eval_ns = time.perf_counter_ns()

    def eval_end(self) -> None:
        """An evaluation ended: its time, from ``eval_begin`` -- else from the end of the last
        step (the HF Trainer says only ``on_evaluate``, after it) -- is evaluation time."""
        end = time.perf_counter_ns()
        start = self._eval_ns if self._eval_ns is not None else self._closed_ns
        self._eval_ns = None
        tracer = api.current()
        if start is None or tracer is None or self._broken:
            return
        try:
            tracer.note_eval(start, end)
        except Exception as exc:
            self._fail(exc)

    def finish(self, status: RunStatus | None = None) -> Path | None:
        """Close an open step and write the summary (``<out_dir>/final_summary.json``)."""
        self.close(ok=status in (None, RunStatus.COMPLETED))
        try:
            path = api.finish(status)
        except Exception as exc:
            self._fail(exc)
            return None
        if path is not None:
            for target in self.log_to:
                self._log(target, path)
        return path

    def _log(self, target: str, path: Path) -> None:
        """Log the summary to a tracker; a failure warns, training (or its end) goes on."""
        import importlib

        try:
            module = importlib.import_module(LOG_TARGETS[target])
            module.log_summary(path)
        except Exception as exc:
            warn(f"could not log the summary to {target} ({exc})")

    def _fail(self, exc: BaseException) -> None:
        if not self._broken:
            self._broken = True
            warn(f"the training callback stopped tracing ({exc!r}); training goes on")
