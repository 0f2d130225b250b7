"""Who holds what a step should have let go: the name in the user's code that keeps a tensor
alive across steps, and the line that stores into it (``predictions`` at train.py:59, for a
``predictions.append(out.logits)``).

Looked for once, at the counters' leak check (tracer/counters.py), and only when a step's
tensors are still alive there: in the locals of the user's frames on the stack (the training
loop's among them), in the containers they hold (the last ``SCAN_ITEMS`` items: a list grows at
its end) and in ``self``'s attributes. The line is read from the frame's bytecode: where the
name's ``append``/``extend``/``insert``/``add`` is called or an item stored, else where it is
assigned.

Reading a running function frame's ``f_locals`` before Python 3.13 leaves a snapshot of its
locals on the frame, which would keep this step's objects alive until the function returns; the
snapshot is emptied after the read (Python rebuilds it on the next read) -- unless the user's
code holds it (``locals()`` returns that same dict): then it is left as it is. From 3.13 on
``f_locals`` is a live view and is only read.
"""

from __future__ import annotations

import dis
import inspect
import sys
from collections import deque
from collections.abc import Iterable
from typing import Any

from traceml_ci.tracer.sites import USER, Sites

#: User frames looked at, the innermost first.
FRAMES = 4
#: Items of a container looked at, from its end.
SCAN_ITEMS = 64
#: Methods that store into a container.
_STORES = frozenset({"append", "extend", "insert", "add", "appendleft", "update",
                     "setdefault", "__setitem__"})
_LOADS = frozenset({"LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF",
                    "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST"})
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
#: References to an unheld snapshot while it is read: the frame's, ours, getrefcount's.
_SNAPSHOT_REFS = 3


def find_holder(kept: Iterable[Any], sites: Sites, frame: Any) -> dict[str, str] | None:
    """``{"name": ..., "at": "file:line"}`` of the first user-code name (from ``frame``
    outwards) that holds one of ``kept``, directly or in a container; None if none does."""
    ids = {id(x) for x in kept}
    if not ids:
        return None
    seen = 0
    while frame is not None and seen < FRAMES:
        code = frame.f_code
        kind, shown = sites.where(code.co_filename)
        if kind == USER:
            seen += 1
            name = _name_in(frame, ids)
            if name is not None:
                line = store_line(code, name) or frame.f_lineno
                return {"name": name, "at": f"{shown}:{line}"}
        frame = frame.f_back
    return None


def _name_in(frame: Any, ids: set[int]) -> str | None:
    optimized = bool(frame.f_code.co_flags & inspect.CO_OPTIMIZED)  # a function's frame
    local = frame.f_locals
    # The snapshot is the dict ``locals()`` returns too: one the user's code holds (``hparams =
    # locals()``) is theirs, never emptied. Unheld, it is referenced by the frame, ``local``
    # and getrefcount's argument.
    shared = sys.getrefcount(local) > _SNAPSHOT_REFS
    try:
        for name, value in list(local.items()):
            if value is local:  # the user's ``locals()`` dict is no holder of its own
                continue
            if _holds(value, ids):
                return str(name)
            if name == "self":
                attrs = getattr(value, "__dict__", None)
                for attr, held in list(attrs.items()) if isinstance(attrs, dict) else ():
                    if _holds(held, ids):
                        return f"self.{attr}"
        return None
    finally:
        if optimized and _SNAPSHOT_LOCALS and isinstance(local, dict) and not shared:
            local.clear()  # the snapshot only: the function's own locals are untouched


def _holds(value: Any, ids: set[int]) -> bool:
    if id(value) in ids:
        return True
    kind = type(value)
    if kind in (list, tuple, deque):
        items = list(value)[-SCAN_ITEMS:]
    elif kind is dict:
        items = list(value.values())[-SCAN_ITEMS:]
    else:
        return False
    return any(id(x) in ids for x in items)


def store_line(code: Any, name: str) -> int | None:
    """The line of ``code`` that stores into ``name`` (``self.x`` too): a store method called
    on it or an item stored (the last such), else its last assignment."""
    *owner, last = name.split(".")
    calls: list[int] = []
    assigns: list[int] = []
    instructions = list(dis.get_instructions(code))
    for i, ins in enumerate(instructions):
        line = _line(ins)
        if line is None:
            continue
        if owner:  # self.x: LOAD self, then LOAD_ATTR x
            if ins.opname in _LOADS and ins.argval == owner[0] and i + 1 < len(instructions):
                nxt = instructions[i + 1]
                if (nxt.opname in ("LOAD_ATTR", "LOAD_METHOD") and nxt.argval == last
                        and _stores_next(instructions, i + 2)):
                    calls.append(line)
            if ins.opname == "STORE_ATTR" and ins.argval == last:
                assigns.append(line)
            continue
        if ins.opname in _LOADS and ins.argval == last and _stores_next(instructions, i + 1):
            calls.append(line)
        elif ins.opname in ("STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF") and (
                ins.argval == last):
            assigns.append(line)
    found = calls or assigns
    return found[-1] if found else None


def _stores_next(instructions: list[Any], i: int) -> bool:
    """Whether the instruction at ``i`` loads a store method, or stores an item soon after."""
    if i >= len(instructions):
        return False
    ins = instructions[i]
    if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in _STORES:
        return True
    return any(x.opname == "STORE_SUBSCR" for x in instructions[i:i + 3])


def _line(ins: Any) -> int | None:
    positions = getattr(ins, "positions", None)
    line = getattr(positions, "lineno", None)
    if line is None:
        line = getattr(ins, "line_number", None) or ins.starts_line
    return line if isinstance(line, int) else None
