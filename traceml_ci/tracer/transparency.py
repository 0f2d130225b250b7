"""What the tracer attaches to a user's module stays invisible to what the user does with it.

Tracing puts callables of ours on the user's modules: forward hooks on a zero-change run's
roots and on sampled modules (``_forward_hooks`` and friends), and for one step the timed
``forward`` that shadows the model's own (``recorder.ForwardTimer``). Left as they are, they
travel with the module: ``torch.save(model)``, ``pickle`` and multiprocessing fail on our local
functions, ``copy.deepcopy(model)`` gives a copy whose ``forward`` still runs the *original*
model, and ``torch.jit.script`` cannot find our hooks' source.

So, while a tracer runs, ``nn.Module.__getstate__`` (which pickle, ``copy`` and ``torch.save``
all call) returns the state without our entries, and ``torch.jit.script`` compiles a module
with our hooks taken out for the call and put back in order after. Nothing here runs per step;
what the user saves loads anywhere, traceml-ci installed or not.

Ours is anything whose function was defined in this package (``__module__`` starts with
``traceml_ci.``): no per-step marking, and bound methods and closures alike answer it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

_PACKAGE = "traceml_ci."


def ours(obj: Any) -> bool:
    """Whether ``obj`` (a hook, a shadowing forward) is the tracer's."""
    try:
        return str(getattr(obj, "__module__", "") or "").startswith(_PACKAGE)
    except Exception:
        return False


def _hook_dicts(state: dict[str, Any]) -> Iterator[tuple[str, dict]]:
    # torch names every per-module hook table ``_..._hooks`` (``_forward_hooks``,
    # ``_forward_hooks_with_kwargs``, ``_forward_hooks_always_called``, ...).
    for key, value in state.items():
        if "_hooks" in key and isinstance(value, dict) and value:
            yield key, value


def without_ours(state: Any) -> Any:
    """A module's pickled state (``__dict__``-like) minus the tracer's hooks and forward shadow.

    Tables that hold none of ours are returned as they are (a shallow ``copy.copy`` still shares
    them); a table that did is replaced by a filtered copy of the same type. The id-keyed side
    tables (``_forward_hooks_with_kwargs``, ``_forward_hooks_always_called``) lose the ids of
    the hooks removed."""
    if not isinstance(state, dict):
        return state
    removed: set[Any] = set()
    changed: dict[str, Any] = {}
    for key, table in _hook_dicts(state):
        drop = [k for k, v in table.items() if ours(v)]
        if drop:
            removed.update(drop)
            changed[key] = type(table)((k, v) for k, v in table.items() if k not in drop)
    if removed:
        for key, table in _hook_dicts(state):
            if key not in changed and any(k in removed for k in table):
                changed[key] = type(table)((k, v) for k, v in table.items() if k not in removed)
    shadow = "forward" in state and ours(state["forward"])
    if not changed and not shadow:
        return state
    state = dict(state, **changed)
    if shadow:
        del state["forward"]
    return state


def hide(module: Any) -> list[tuple[dict, list, bool]]:
    """Take our hooks (and a forward shadow) out of ``module`` and its submodules; ``restore``
    puts each table back as it was: the same dict object, in the same order (torch's hook
    handles hold it by reference)."""
    saved: list[tuple[dict, list, bool]] = []  # (table, its items, the whole table?)
    try:
        for mod in module.modules():
            state = mod.__dict__
            tables = dict(_hook_dicts(state))
            clean = without_ours(tables)
            for key, table in tables.items():
                if clean[key] is not table:
                    saved.append((table, list(table.items()), True))
                    table.clear()
                    table.update(clean[key])
            if ours(state.get("forward")):
                saved.append((state, [("forward", state.pop("forward"))], False))
    except Exception:
        restore(saved)
        raise
    return saved


def restore(saved: list[tuple[dict, list, bool]]) -> None:
    for table, items, whole in reversed(saved):
        if whole:
            table.clear()
        table.update(items)


class Transparency:
    """Installs the two patches above for one tracer's life; ``uninstall`` puts torch back."""

    def __init__(self, fail: Callable[[BaseException], None]) -> None:
        self._fail = fail
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        if self._undo:
            return
        import torch
        from torch import nn

        fail = self._fail
        getstate = nn.Module.__dict__["__getstate__"]

        @functools.wraps(getstate)
        def __getstate__(self: Any) -> Any:
            state = getstate(self)
            try:
                return without_ours(state)
            except Exception as exc:  # the user's save goes on as it would have
                fail(exc)
                return state

        nn.Module.__getstate__ = __getstate__
        self._undo.append(lambda: setattr(nn.Module, "__getstate__", getstate))

        jit = getattr(torch, "jit", None)
        script = getattr(jit, "script", None)
        if script is None:  # pragma: no cover - a torch without TorchScript
            return

        @functools.wraps(script)
        def traced_script(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(obj, nn.Module):
                return script(obj, *args, **kwargs)
            try:
                saved = hide(obj)
            except Exception as exc:
                fail(exc)
                saved = []
            try:
                return script(obj, *args, **kwargs)
            finally:
                restore(saved)

        jit.script = traced_script
        self._undo.append(lambda: setattr(jit, "script", script))

    def uninstall(self) -> None:
        while self._undo:
            with contextlib.suppress(Exception):
                self._undo.pop()()
