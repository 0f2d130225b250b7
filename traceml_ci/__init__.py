"""traceml-ci: where each PyTorch training step's time and memory go, and a CI gate on it.

    import traceml_ci as traceml
    traceml.init(mode="auto")
    for batch in dataloader:
        with traceml.trace_step(model):
            ...
    traceml.finish()

The tracing API is loaded on first use, so ``import traceml_ci.gate`` never imports torch.
torch is not a dependency (the gate runs without it); tracing uses the torch you train with,
and ``init()`` raises an ImportError saying so when there is none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from traceml_ci._version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from traceml_ci.tracer.api import finish, init, phase, trace_step, wrap_dataloader

__all__ = ["__version__", "finish", "init", "phase", "trace_step", "wrap_dataloader"]

_API = {"init", "trace_step", "phase", "wrap_dataloader", "finish", "current"}


def __getattr__(name: str) -> Any:
    if name in _API:
        from traceml_ci.tracer import api

        # Kept as a global: ``traceml.trace_step`` is looked up on every step, and a module
        # ``__getattr__`` costs ~0.8 us a lookup where a global costs ~10 ns.
        value = globals()[name] = getattr(api, name)
        return value
    raise AttributeError(f"module 'traceml_ci' has no attribute {name!r}")
