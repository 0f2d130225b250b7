"""The tracer's hold on a user's objects: taking its hooks off them (every handle, whatever one
of them raises), and references that never keep a model alive."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any


def remove_all(handles: Iterable[Any]) -> None:
    """Call ``remove()`` on every handle (torch's ``RemovableHandle``s).

    One that raises (its module or tensor already gone, interpreter exit) does not keep the
    others on: at finish or after an error the user's objects must be left as we found them."""
    for h in handles:
        try:
            h.remove()
        except Exception:
            pass


def held_weakly(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj`` (called, it gives ``obj`` or None once it is gone); a
    strong one for an object that takes no weak references (a module-like without
    ``__weakref__``)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
