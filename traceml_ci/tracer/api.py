"""The public tracing API: init, trace_step, phase, wrap_dataloader, finish."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from traceml_ci.summary.model import RunStatus
from traceml_ci.tracer import lifecycle
from traceml_ci.tracer.clocks import ClockFactory, HostClock
from traceml_ci.tracer.config import InitOptions, TracerConfig, given_options
from traceml_ci.tracer.recorder import DL
from traceml_ci.tracer.session import PhaseScope, StepScope, Tracer

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")

TORCH_MISSING = (
    "traceml_ci: tracing needs PyTorch, which is not installed in this environment "
    "(install the torch build you train with, e.g. pip install torch)"
)

_tracer: Tracer | None = None
#: The process that started ``_tracer``: a fork of it (os.fork, a fork DataLoader worker)
#: inherits the tracer but must never write its summary.
_owner_pid: int | None = None
#: Print where the summary went at finish (init() and traceml-ci run; not the pytest plugin).
_announce = False
#: What the line says besides the path, e.g. that ``--out`` overrode ``init(out_dir=...)``.
_note = ""
#: Set by ``traceml-ci run``'s child: the tracer to start once the script imports torch.
_armed: TracerConfig | None = None


def current() -> Tracer | None:
    """The process's active tracer, if any."""
    return _tracer


def start(
    config: TracerConfig,
    *,
    zero_change: bool = False,
    at_exit: bool = True,
    announce: bool = False,
    clock: ClockFactory = HostClock,
) -> Tracer:
    """Start a fresh tracer (finishing any previous one without writing over its summary).

    The pytest plugin and ``traceml-ci run`` use this; scripts call ``init``. ``announce``:
    print one line at finish saying where the summary went. ``clock``: makes the tracer's host
    clock (tests: a fake one). ImportError when torch is missing.
    """
    global _tracer, _owner_pid, _announce, _note
    try:
        import torch  # noqa: F401  (the tracer's patches need it; say so plainly if absent)
    except ImportError as exc:
        raise ImportError(TORCH_MISSING) from exc
    if _tracer is not None and _tracer.summary is None:
        _tracer.finish()
    _tracer = Tracer(config, zero_change=zero_change, clock=clock)
    _owner_pid = os.getpid()
    _announce, _note = announce, ""
    if at_exit:
        lifecycle.install(finish_at_exit, current)
    return _tracer


def arm(config: TracerConfig) -> None:
    """``traceml-ci run``'s child: start a zero-change tracer with ``config`` when the script
    first imports torch (or calls init()), so a script that never does costs no torch import."""
    global _armed
    _armed = config
    if "torch" in sys.modules:
        start_armed()


def armed() -> bool:
    """Whether a tracer is armed and has not started yet (the script has not imported torch)."""
    return _armed is not None


def start_armed() -> Tracer | None:
    """Start the armed tracer now, if one is armed and none runs (idempotent)."""
    global _armed
    config, _armed = _armed, None
    if config is None or _tracer is not None:
        return _tracer
    return start(config, zero_change=True, announce=True)


def stop() -> None:
    """Forget the current tracer (after its finish), e.g. at the end of a pytest test."""
    global _tracer
    if _tracer is not None:
        _tracer.stop_live()
        _tracer.patches.uninstall()
        _tracer.inputs.discard()
        _tracer.counters.close()
        _tracer.flop_count.end()
        if _tracer.roots is not None:
            _tracer.roots.uninstall()
    _tracer = None


def init(mode: str = "auto", **options: Unpack[InitOptions]) -> Tracer | None:
    """Start tracing this process. Keywords (``InitOptions``; None is "not given"):

    mode: "auto" patches DataLoader iteration, autograd backward and optimizer steps, and times
    the forward of the model given to ``trace_step``; "manual" patches nothing -- mark phases
    with ``phase()`` and ``wrap_dataloader()``.
    out_dir: where final_summary.json goes (default ``$TRACEML_CI_OUT`` or ``./traceml-out``).
    run_name: the run's name in its summary (default: the script's name).
    warmup_steps: the first N steps (default 5) are left out of the statistics.
    batch_size: samples per step, for samples/s (default: inferred from the first batch).
    thresholds: the diagnoses' thresholds (``traceml_ci.summary.thresholds.Thresholds``).
    live: keep ``<out_dir>/live/rank<N>.json`` up to date for the live view (default on;
    ``$TRACEML_CI_LIVE=0`` turns it off too).
    module_sample_s: seconds of training between two steps whose forward and backward are
    timed per submodule (default 0.5; 0 turns it off; ``$TRACEML_CI_MODULE_SAMPLE_S``).
    Under ``traceml-ci run``, the flags given there win over these keywords.
    Returns None, doing nothing, in a process that does not own the run (a DataLoader worker,
    or a spawned child re-importing the script). ImportError when torch is missing.
    """
    global _note
    given = given_options(options, InitOptions, "init")
    if not lifecycle.owns_run():
        return None
    if _tracer is None:
        start_armed()
    out_dir = given.get("out_dir")
    if out_dir is not None:
        given["out_dir"] = Path(out_dir)
    if mode is not None:
        given["mode"] = mode
    if _tracer is not None and _tracer.summary is None:
        config = _tracer.config
        if out_dir is not None and "out_dir" in config.locked and Path(out_dir) != config.out_dir:
            _note = f" (traceml-ci run --out overrides the script's init(out_dir={str(out_dir)!r}))"
        _tracer.reconfigure(**given)
        return _tracer
    return start(TracerConfig(**given), announce=True)


def trace_step(*models: Any) -> StepScope | AbstractContextManager[None]:
    """Context manager around one training step. ``models``: the model(s) whose outermost
    forward is the forward phase (several for e.g. a GAN; none to time forward as ``other``)."""
    tracer = _tracer
    if tracer is None:
        tracer = init()
        if tracer is None:
            return nullcontext()
    else:
        last = tracer._last_scope  # the same model(s) as last step: reuse its scope
        if last is not None and last.key == models:
            return last
    return tracer.step_scope(models)


def phase(name: str) -> PhaseScope | AbstractContextManager[None]:
    """Context manager marking a phase by hand: dataloader, forward, backward or optimizer."""
    tracer = _tracer if _tracer is not None else init()
    return PhaseScope(tracer, name) if tracer is not None else nullcontext()


def wrap_dataloader(iterable: Iterable[T]) -> Iterator[T]:
    """Iterate ``iterable``, timing each ``next()`` as the dataloader phase (manual mode)."""
    tracer = _tracer if _tracer is not None else init()
    if tracer is None:
        yield from iterable
        return
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
    """Write ``<out_dir>/final_summary.json`` and return its path. Also runs at interpreter exit.

    If another process finished a summary in the same folder while this one ran, this one's
    goes to ``<out_dir>/pid-<pid>/final_summary.json`` instead (and says so on stderr)."""
    tracer = _tracer
    if tracer is None or os.getpid() != _owner_pid:
        return None
    if tracer.summary is not None:
        return tracer.path
    with lifecycle.finishing():
        return _finish(tracer, status)


def _finish(tracer: Tracer, status: RunStatus | str | None) -> Path | None:
    path = tracer.finish(status)
    target = tracer.diverted_from
    if path is not None and (_announce or target is not None):
        if target is not None:
            line = (
                f"another process wrote {target} during this run; "
                f"this one's summary went to {path}"
            )
        else:
            line = f"summary written to {path}{_note}"
        try:
            sys.stderr.write(f"traceml-ci: {line}\n")
        except Exception:  # pragma: no cover - a closed stderr at exit
            pass
    return path


def finish_at_exit() -> None:
    """The at-exit finish: the owner's tracer, if one runs and has not finished."""
    finish()
