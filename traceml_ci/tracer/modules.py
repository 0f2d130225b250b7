"""Per-module forward time, sampled: which submodule of the traced model the forward time is in.

Hooks on every module of every step would cost a small step dearly, so none are installed
between samples. About every ``SAMPLE_EVERY_S`` seconds of training (checked where the tracer
already samples RSS, ~10 times a second, never per step), between two steps, forward hooks are
put on up to ``MAX_MODULES`` submodules of the traced model: its children, and their children
(the entries of a ModuleList or ModuleDict count as the level they hold, since a container is
never called itself), breadth first. They time that step's forward on the host clock and
remove themselves when the model's forward returns: one step in a sample, nothing on the others.

Times are inclusive (a module's time holds its children's) and shares are of the model's own
forward in the same sampled steps. Host clock only: on a device clock a module's host time is
only its kernel launches, so device runs are not sampled. Backward per module is not measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Seconds of training between two sampled steps.
SAMPLE_EVERY_S = 0.5
#: Submodules timed at most (breadth first from the model's children).
MAX_MODULES = 32
#: Modules listed in the summary (the slowest).
TOP_MODULES = 8


def select_modules(model: Any, limit: int = MAX_MODULES) -> list[tuple[str, Any]]:
    """The model's children and grandchildren, breadth first, containers looked through."""
    try:
        from torch import nn
    except Exception:
        return []
    containers = (nn.ModuleList, nn.ModuleDict)
    out: list[tuple[str, Any]] = []
    frontier = [("", model, 0)]
    while frontier and len(out) < limit:
        nxt = []
        for prefix, module, depth in frontier:
            for name, child in module.named_children():
                full = f"{prefix}.{name}" if prefix else name
                if isinstance(child, containers):
                    nxt.append((full, child, depth))  # its entries are at this level
                    continue
                if len(out) < limit:
                    out.append((full, child))
                if depth + 1 < 2:
                    nxt.append((full, child, depth + 1))
        frontier = nxt
    return out


class ModuleSampler:
    """Arms forward hooks for one step now and then; keeps each module's sampled times."""

    def __init__(self, warn: Callable[[str], None], every_s: float = SAMPLE_EVERY_S) -> None:
        self._warn = warn
        self.every_ns = int(every_s * 1e9)
        self.model: Any = None
        self.modules: list[tuple[str, Any]] = []
        self.handles: list[Any] = []
        self.next_ns = 0
        self.sampled = 0
        #: name -> summed ms over the sampled steps; the model's own forward ms likewise.
        self.totals: dict[str, float] = {}
        self.forward_ms = 0.0
        self._open: dict[str, int] = {}
        self._step: dict[str, float] = {}
        self.enabled = True

    def watch(self, model: Any) -> None:
        """The model whose submodules are sampled (the first traced one)."""
        if self.model is None and model is not None:
            self.model = model
            self.modules = select_modules(model)

    def tick(self, now_ns: int) -> None:
        """Between steps (called where RSS is sampled): arm the hooks if a sample is due."""
        if not self.enabled or self.handles or not self.modules or now_ns < self.next_ns:
            return
        self.next_ns = now_ns + self.every_ns
        try:
            self._arm()
        except Exception as exc:
            self._disarm()
            self.enabled = False
            self._warn(f"module sampling stopped ({exc!r})")

    def _arm(self) -> None:
        self._open, self._step = {}, {}
        clock = time.perf_counter_ns
        opened, step = self._open, self._step

        def pre(name: str) -> Callable[..., None]:
            def hook(module: Any, args: Any) -> None:
                opened[name] = clock()
            return hook

        def post(name: str) -> Callable[..., None]:
            def hook(module: Any, args: Any, output: Any) -> None:
                t0 = opened.pop(name, None)
                if t0 is not None:
                    step[name] = step.get(name, 0.0) + (clock() - t0) / 1e6
            return hook

        for name, module in self.modules:
            self.handles.append(module.register_forward_pre_hook(pre(name)))
            self.handles.append(module.register_forward_hook(post(name)))

        def root_pre(module: Any, args: Any) -> None:
            opened[""] = clock()

        def root_post(module: Any, args: Any, output: Any) -> None:
            t0 = opened.pop("", None)
            self._disarm()  # one step's forward: the hooks go as it returns
            if t0 is None:
                return
            self.forward_ms += (clock() - t0) / 1e6
            self.sampled += 1
            for name, ms in step.items():
                self.totals[name] = self.totals.get(name, 0.0) + ms

        self.handles.append(self.model.register_forward_pre_hook(root_pre))
        # Last among the model's post hooks: it removes them all.
        self.handles.append(self.model.register_forward_hook(root_post))

    def _disarm(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            try:
                h.remove()
            except Exception:
                pass

    def stop(self) -> None:
        self.enabled = False
        self._disarm()

    def summary(self) -> dict[str, Any] | None:
        """The ``modules`` block: the slowest modules' mean forward ms per sampled step and
        share of the model's forward (inclusive times); None when nothing was sampled."""
        if not self.sampled or self.forward_ms <= 0:
            return None
        top = sorted(self.totals.items(), key=lambda kv: -kv[1])[:TOP_MODULES]
        n = self.sampled
        return {
            "sampled_steps": n,
            "every_s": self.every_ns / 1e9,
            "forward_ms": round(self.forward_ms / n, 4),
            "forward": [{"name": name, "ms": round(ms / n, 4),
                         "share_pct": round(100.0 * ms / self.forward_ms, 2)}
                        for name, ms in top],
        }
