"""Taking the tracer's hooks off a user's objects: every handle, whatever one of them raises."""

from __future__ import annotations

from collections.abc import Iterable
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
