"""The wait phase: time a step spends waiting in collectives for the other ranks.

Two sources, both only while a process group is in use (docs/distributed.md):

- **DDP's gradient all-reduce.** DDP's reducer launches each bucket's all-reduce as soon as
  its gradients are ready, while backward goes on computing, and blocks at the end of backward
  until every bucket is done. So a rank's wait is backward's end minus the moment its last
  gradient became ready; the rest of backward is its compute. ``GradReadyProbe`` finds that
  moment with ``Tensor.register_post_accumulate_grad_hook`` -- never DDP's
  ``register_comm_hook``, of which a model may have only one, the user's. On the first
  ``CALIBRATION_STEPS`` steps every parameter is hooked and the order they become ready in is
  noted; from then on only the few that were ready last keep a hook (one Python call each per
  backward), which calls ``Recorder.grads_ready``.
- **Explicit collectives** (``torch.distributed.all_reduce``, ``barrier``, ...) called inside a
  step: ``CollectivePatches`` times each call as the wait phase (an ``async_op=True`` call:
  its own time only; the wait is then in ``work.wait()``, wherever that is). The module's
  functions are replaced while tracing and restored at finish; a function imported by name
  before the process group existed (``from torch.distributed import all_reduce``) keeps the
  original and is not timed.

FSDP's all-gathers and reduce-scatters go through the same functions (FSDP2:
``all_gather_single``, ``reduce_scatter_single``), so they are the wait phase too, wherever in
the step they run; forward and backward keep their compute.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from traceml_ci.tracer.handles import remove_all
from traceml_ci.tracer.recorder import WAIT, Recorder

#: The synchronous collectives (and point-to-point calls) of ``torch.distributed`` timed as
#: the wait phase when called inside a step.
COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
)
#: Steps on which every parameter of a DDP model is hooked to find those ready last.
CALIBRATION_STEPS = 2
#: Parameters kept hooked after calibration, per calibrated step: the last ready, and the ones
#: just before it (an order that varies a little between steps, a parameter that is unused in
#: some steps with ``find_unused_parameters``).
LAST_READY_KEPT = 2


class CollectivePatches:
    """``torch.distributed``'s collectives timed as the wait phase inside a step."""

    def __init__(self, rec: Recorder, fail: Callable[[BaseException], None]) -> None:
        self.rec = rec
        self.fail = fail
        self._originals: dict[str, Any] = {}
        self._dist: Any = None

    def install(self, dist: Any) -> None:
        if self._originals:
            return
        rec = self.rec
        for name in COLLECTIVES:
            orig = getattr(dist, name, None)
            if orig is None or not callable(orig):
                continue
            timed = rec.timed(orig, WAIT, self.fail)
            wrapper = _in_step_only(orig, timed, rec)
            self._originals[name] = orig
            setattr(dist, name, wrapper)
        self._dist = dist

    def uninstall(self) -> None:
        dist, self._dist = self._dist, None
        for name, orig in self._originals.items():
            setattr(dist, name, orig)
        self._originals = {}


def _in_step_only(orig: Callable[..., Any], timed: Callable[..., Any], rec: Recorder) -> Any:
    """``timed`` inside a step (zero-change mode: always, its steps hold what lies between
    them), ``orig`` outside: a collective between steps (an evaluation's, a barrier before the
    loop) belongs to no step, unlike a batch fetched before one."""

    @functools.wraps(orig)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if rec.in_step or rec.implicit:
            return timed(*args, **kwargs)
        return orig(*args, **kwargs)

    collective.__wrapped__ = orig  # type: ignore[attr-defined]
    return collective


class _Calibrate:
    """A calibration hook: notes its parameter's place in the ready order, then does what the
    lasting hook does. A module-level class, not a closure (STYLE.md: what we attach to a
    user's objects); torch does not copy parameter hooks into a deepcopy or a pickle."""

    __slots__ = ("probe", "index")

    def __init__(self, probe: GradReadyProbe, index: int) -> None:
        self.probe = probe
        self.index = index

    def __call__(self, param: Any) -> None:
        probe = self.probe
        probe.order.append(self.index)
        probe.rec.grads_ready()


class _Ready:
    """The lasting hook on a parameter that is ready last: backward's wait may begin here."""

    __slots__ = ("rec",)

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def __call__(self, param: Any) -> None:
        self.rec.grads_ready()


def ddp_parameters(models: tuple[Any, ...]) -> list[Any]:
    """The parameters DDP's reducer all-reduces, of the first DDP module among ``models``
    (empty when none is DDP)."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception:
        return []
    for model in models:
        try:
            for module in model.modules():
                if isinstance(module, DistributedDataParallel):
                    ignored = set(getattr(module, "parameters_to_ignore", ()) or ())
                    return [
                        p
                        for name, p in module.module.named_parameters()
                        if p.requires_grad and name not in ignored
                    ]
        except Exception:
            continue
    return []


class GradReadyProbe:
    """Hooks on a DDP model's parameters that tell the recorder when its last gradient became
    ready (``Recorder.grads_ready``): calibrated on the first steps, then a few hooks only."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        #: A DDP model was looked for (once).
        self.watched = False
        #: Calibration hooks are on every parameter: ``after_step`` must run after each step.
        self.calibrating = False
        #: Parameter indices in the order their gradients became ready, this step.
        self.order: list[int] = []
        self.params: list[Any] = []
        self.handles: list[Any] = []
        self.steps = 0
        self.kept: list[int] = []
        self.last_ready: list[Any] = []

    def watch(self, models: tuple[Any, ...]) -> bool:
        """Hook every parameter of the first DDP module among ``models``, once; whether one was
        found."""
        if self.watched:
            return False
        self.watched = True
        params = ddp_parameters(models)
        if not params or not hasattr(params[0], "register_post_accumulate_grad_hook"):
            return False
        self.params = params
        self.handles = [
            p.register_post_accumulate_grad_hook(_Calibrate(self, i)) for i, p in enumerate(params)
        ]
        self.calibrating = True
        return True

    def after_step(self) -> None:
        """A step ended while calibrating: keep the parameters that were ready last; after
        ``CALIBRATION_STEPS`` steps that ran a backward, only those stay hooked."""
        order, self.order = self.order, []
        if not order:  # no backward through the model in this step
            return
        tail: list[int] = []
        for i in reversed(order):
            if i not in tail:
                tail.append(i)
                if len(tail) == LAST_READY_KEPT:
                    break
        self.kept += [i for i in tail if i not in self.kept]
        self.steps += 1
        if self.steps >= CALIBRATION_STEPS:
            self._settle()

    def _settle(self) -> None:
        self._remove()
        self.calibrating = False
        #: The parameters that stay hooked (benchmarks/wait_overhead.py hooks them again).
        self.last_ready = [self.params[i] for i in self.kept]
        self.hook_last_ready()
        self.params = []

    def hook_last_ready(self) -> None:
        """Hook the parameters that are ready last (after calibration)."""
        hook = _Ready(self.rec)
        self.handles = [p.register_post_accumulate_grad_hook(hook) for p in self.last_ready]

    def remove_hooks(self) -> None:
        """Every hook off (the benchmark's "off" side; ``close`` at finish)."""
        self._remove()

    def _remove(self) -> None:
        handles, self.handles = self.handles, []
        remove_all(handles)

    def close(self) -> None:
        """Finish: every hook off the user's parameters."""
        self._remove()
        self.calibrating = False
        self.params = []
        self.last_ready = []
