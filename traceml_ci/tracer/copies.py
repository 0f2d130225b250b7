"""The h2d phase: time a step spends copying tensors from host to device.

A batch comes off the DataLoader in host memory and is copied to the device inside the step
(``x.to(device)``, ``x.cuda()``, ``buf.copy_(x)``): that copy is time the device may wait for,
and pinned memory and ``non_blocking=True`` are what shorten it. ``CopyPatches`` replaces
``torch.Tensor.to``, ``cuda`` and ``copy_`` while tracing on an accelerator and times a call
as the h2d phase when it is, inside a step, on the training thread, a copy from a host tensor to
a device: with the phases' clock (device events on CUDA, recorded on the current stream, so a
``non_blocking`` copy counts until the device has done it -- no synchronisation), exclusive like
every phase (a copy inside forward is h2d, not forward). Everything else -- outside a step,
another thread, a device tensor, a dtype cast -- goes straight to torch after a check or two.

Cost: a CPU-only run never installs it (it has no device to copy to), so its steps pay nothing
and its summary has no h2d key; on an accelerator only the calls of these three methods pay,
not the steps (benchmarks/tracer_overhead.py counts the bytecodes). A run whose steps never
copied has no h2d key either (``seen``).

Not timed: copies made by C++ code without going through these methods (``pin_memory``'s
thread, a DataLoader ``collate_fn`` that builds device tensors, ``torch.as_tensor(x,
device=...)``, a ``Module.to`` of a model's parameters -- outside steps anyway), and a copy that
is issued on a side stream: its events are on the current stream.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from traceml_ci.tracer.recorder import H2D, Recorder

#: The ``torch.Tensor`` methods that copy a tensor to another device.
METHODS: tuple[str, ...] = ("to", "cuda", "copy_")


def on_host(t: Any) -> bool:
    """Whether tensor ``t`` lives in host memory."""
    return getattr(t, "is_cpu", False) is True


def is_device(device: Any) -> bool:
    """Whether ``device`` (a torch.device) is an accelerator a copy from the host goes to."""
    return device.type not in ("cpu", "meta")


class CopyPatches:
    """``torch.Tensor``'s copy methods timed as the h2d phase inside a step.

    ``on_host(tensor)`` and ``is_device(torch.device)`` say what a host tensor and a device
    are: the defaults above; a test on a CPU-only machine lets the CPU play the device
    (``is_device=lambda d: d.type == "cpu"``, copies made with ``.to("cpu", copy=True)``),
    through the same code path."""

    def __init__(
        self,
        rec: Recorder,
        fail: Callable[[BaseException], None],
        on_host: Callable[[Any], bool] = on_host,
        is_device: Callable[[Any], bool] = is_device,
    ) -> None:
        self.rec = rec
        self.fail = fail
        self.on_host = on_host
        self.is_device = is_device
        #: A copy was timed: the summary has the h2d phase.
        self.seen = False
        self._originals: dict[str, Any] = {}
        self._cls: Any = None
        #: The methods ``torch.Tensor`` defines itself (the others it inherits).
        self._own: set[str] = set()

    @property
    def installed(self) -> bool:
        return bool(self._originals)

    def install(self) -> None:
        """Patch ``torch.Tensor``'s copy methods (once; on the training thread: copies made on
        other threads are never timed)."""
        if self._originals:
            return
        import torch

        cls = torch.Tensor
        originals = {name: getattr(cls, name) for name in METHODS}
        self._own = {name for name in METHODS if name in cls.__dict__}
        owner = threading.get_ident()
        made = {
            "to": self._to(originals["to"], owner, torch),
            "cuda": self._cuda(originals["cuda"], owner),
            "copy_": self._copy_(originals["copy_"], owner),
        }
        for name, wrapper in made.items():
            setattr(cls, name, wrapper)
        self._originals = originals
        self._cls = cls

    def uninstall(self) -> None:
        cls, self._cls = self._cls, None
        originals, self._originals = self._originals, {}
        for name, orig in originals.items():
            if name in self._own:
                setattr(cls, name, orig)
            else:
                delattr(cls, name)  # inherited from torch._C.TensorBase: inherited again

    # -- the wrappers: each checks the cheapest thing first (a step open), then the tensors --
    def _to(self, orig: Callable[..., Any], owner: int, torch: Any) -> Callable[..., Any]:
        patch, rec = self, self.rec
        timed = rec.timed(orig, H2D, self.fail)
        get_ident = threading.get_ident
        tensor_cls, device_cls = torch.Tensor, torch.device

        def destination(args: tuple, kwargs: dict) -> Any:
            """The device ``to(*args, **kwargs)`` copies to; None when it names none."""
            dev = kwargs.get("device") if kwargs else None
            if dev is None and args:
                first = args[0]
                if isinstance(first, tensor_cls):
                    return first.device
                if isinstance(first, (str, int, device_cls)) and not isinstance(first, bool):
                    dev = first
            if dev is None or isinstance(dev, device_cls):
                return dev
            try:
                return device_cls(dev)
            except Exception:
                return None

        @functools.wraps(orig)
        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            if (rec.in_step or rec.implicit) and patch.on_host(self) and get_ident() == owner:
                dest = destination(args, kwargs)
                if dest is not None and patch.is_device(dest):
                    patch.seen = True
                    return timed(self, *args, **kwargs)
            return orig(self, *args, **kwargs)

        return to

    def _cuda(self, orig: Callable[..., Any], owner: int) -> Callable[..., Any]:
        patch, rec = self, self.rec
        timed = rec.timed(orig, H2D, self.fail)
        get_ident = threading.get_ident

        @functools.wraps(orig)
        def cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
            if (rec.in_step or rec.implicit) and patch.on_host(self) and get_ident() == owner:
                patch.seen = True
                return timed(self, *args, **kwargs)
            return orig(self, *args, **kwargs)

        return cuda

    def _copy_(self, orig: Callable[..., Any], owner: int) -> Callable[..., Any]:
        patch, rec = self, self.rec
        timed = rec.timed(orig, H2D, self.fail)
        get_ident = threading.get_ident

        @functools.wraps(orig)
        def copy_(self: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
            if (
                (rec.in_step or rec.implicit)
                and get_ident() == owner
                and patch.on_host(src)
                and patch.is_device(self.device)
            ):
                patch.seen = True
                return timed(self, src, *args, **kwargs)
            return orig(self, src, *args, **kwargs)

        return copy_
