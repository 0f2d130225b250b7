"""The public tracing API: init, trace_step, phase, wrap_dataloader, finish."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from traceml_ci.summary.model import RunStatus
from traceml_ci.summary.thresholds import Thresholds
from traceml_ci.tracer import lifecycle
from traceml_ci.tracer.config import TracerConfig, env_defaults
from traceml_ci.tracer.recorder import DL
from traceml_ci.tracer.session import PhaseScope, StepScope, Tracer

T = TypeVar("T")

_tracer: Tracer | None = None


def current() -> Tracer | None:
    """The process's active tracer, if any."""
    return _tracer


def start(config: TracerConfig, *, zero_change: bool = False, at_exit: bool = True) -> Tracer:
    """Start a fresh tracer (finishing any previous one without writing over its summary).

    The pytest plugin and ``traceml-ci run`` use this; scripts call ``init``.
    """
    global _tracer
    if _tracer is not None and _tracer.summary is None:
        _tracer.finish()
    _tracer = Tracer(config, zero_change=zero_change)
    if at_exit:
        lifecycle.install(current)
    return _tracer


def stop() -> None:
    """Forget the current tracer (after its finish), e.g. at the end of a pytest test."""
    global _tracer
    if _tracer is not None:
        _tracer.patches.uninstall()
        if _tracer.roots is not None:
            _tracer.roots.uninstall()
    _tracer = None


def init(
    mode: str = "auto",
    *,
    out_dir: str | Path | None = None,
    run_name: str | None = None,
    warmup_steps: int | None = None,
    batch_size: int | None = None,
    thresholds: Thresholds | None = None,
) -> Tracer:
    """Start tracing this process.

    mode: "auto" patches DataLoader iteration, autograd backward and optimizer steps, and times
    the forward of the model given to ``trace_step``; "manual" patches nothing -- mark phases
    with ``phase()`` and ``wrap_dataloader()``.
    out_dir: where final_summary.json goes (default ``$TRACEML_CI_OUT`` or ``./traceml-out``).
    warmup_steps: the first N steps (default 5) are left out of the statistics.
    batch_size: samples per step, for samples/s (default: inferred from the first batch).
    Under ``traceml-ci run``, the flags given there win over these keywords.
    """
    options: dict[str, Any] = {**env_defaults()}
    given = {
        "mode": mode,
        "out_dir": Path(out_dir) if out_dir is not None else None,
        "run_name": run_name,
        "warmup_steps": warmup_steps,
        "batch_size": batch_size,
        "thresholds": thresholds,
    }
    options.update({k: v for k, v in given.items() if v is not None})
    if _tracer is not None and _tracer.summary is None:
        _tracer.reconfigure(**options)
        return _tracer
    return start(TracerConfig(**options))


def trace_step(*models: Any) -> StepScope:
    """Context manager around one training step. ``models``: the model(s) whose outermost
    forward is the forward phase (several for e.g. a GAN; none to time forward as ``other``)."""
    tracer = _tracer
    if tracer is None:
        tracer = init()
    else:
        last = tracer._last_scope  # the same model(s) as last step: reuse its scope
        if last is not None and last.key == models:
            return last
    return tracer.step_scope(models)


def phase(name: str) -> PhaseScope:
    """Context manager marking a phase by hand: dataloader, forward, backward or optimizer."""
    tracer = _tracer if _tracer is not None else init()
    return PhaseScope(tracer, name)


def wrap_dataloader(iterable: Iterable[T]) -> Iterator[T]:
    """Iterate ``iterable``, timing each ``next()`` as the dataloader phase (manual mode)."""
    tracer = _tracer if _tracer is not None else init()
    it = iter(iterable)
    rec = tracer.rec
    while True:
        if tracer.enabled:
            rec.phase_begin(DL)
        try:
            item = next(it)
        except StopIteration:
            if tracer.enabled:
                rec.phase_abort(DL)
            return
        if tracer.enabled:
            rec.phase_end(DL)
            if tracer.batch_size is None:
                tracer._on_first_batch(item)
        yield item


def finish(status: RunStatus | str | None = None) -> Path | None:
    """Write ``<out_dir>/final_summary.json`` and return its path. Also runs at interpreter exit."""
    if _tracer is None:
        return None
    return _tracer.finish(status)
