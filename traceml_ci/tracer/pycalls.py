"""Python calls per step: the Python functions one warmup step called, the user's code and
the libraries' apart, counted by cProfile's C profiler (no Python callback per call).

Per-step Python work that no ATen count sees -- a JSON line built each step, a hand-written
loop over the parameters, a tokenizer call -- is a count here. The two steps after the
counters' sampled step (tracer/counters.py) are counted, so that the counters' dispatch mode and
hooks are not, and the one with fewer calls is kept: work done once -- a lazy import, a cache
filled on first use -- falls out. traceml-ci's own functions are left out, with the calls
they make (its housekeeping runs on the training thread when its clock says so: +14 calls in
one step of three, measured, before they were left out). A signal handler or a finalizer of
the user's can still run in a counted step: the gate's row has a floor (gate/counted/counters.py).
The cyclic garbage collector is paused for those steps: a collection's finalizers would run
whatever another test left behind, at a moment set by allocations elsewhere -- not the step's
calls. A profiler already
in use (``sys.getprofile()``) is never replaced: nothing is counted then. Nor from Python 3.12
on, where cProfile sees every thread's calls (``NOT_MEASURED_THREADS``).
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from traceml_ci.tracer.sites import LIBRARY, OWN, STDLIB, USER, Sites

#: Files whose calls are the input pipeline's, counted by its own counter (tracer/inputs.py):
#: a DataLoader iterator's ``__next__`` inside a step polls its workers' queue as often as
#: the clock lets it. What only they call is left out with them.
INPUT_PIPELINE = ("torch/utils/data/dataloader.py",)
#: User functions named in the block (the most called first).
TOP_FUNCTIONS = 3
NOT_MEASURED_PROFILER = "a profiler is in use"
#: From Python 3.12 cProfile is built on sys.monitoring, which sees every thread (a
#: pin-memory thread, a logger's): the count would follow their timing.
NOT_MEASURED_THREADS = "Python 3.12+: cProfile counts every thread"
_PER_THREAD = sys.version_info < (3, 12)


class PythonCalls:
    """``start()`` at a counted step's start, ``stop(sites)`` at its end (``STEPS`` of them);
    ``block`` then holds the summary's ``counters.python`` (or ``reason`` why not)."""

    #: Steps counted; the one with the fewest calls is kept.
    STEPS = 2

    def __init__(self) -> None:
        self._profile: Any = None
        self._gc_was_on = False
        self.block: dict[str, Any] | None = None
        self.counted = 0
        self.reason: str | None = None

    @property
    def active(self) -> bool:
        return self._profile is not None

    def start(self) -> bool:
        if not _PER_THREAD:
            self.reason = NOT_MEASURED_THREADS
            return False
        if sys.getprofile() is not None:
            self.reason = NOT_MEASURED_PROFILER
            return False
        import cProfile

        profile = cProfile.Profile(builtins=False)
        self._gc_was_on = gc.isenabled()
        gc.disable()
        try:
            profile.enable()
        except Exception:
            self._resume_gc()
            raise
        self._profile = profile
        return True

    def stop(self, sites: Sites | None) -> None:
        profile, self._profile = self._profile, None
        if profile is None:
            return
        try:
            profile.disable()
        finally:
            self._resume_gc()
        block = calls_block(profile.getstats(), sites or Sites())
        self.counted += 1
        if self.block is None or block["per_step"] < self.block["per_step"]:
            self.block = block

    def abort(self) -> None:
        """The run ended mid-step: stop counting, resume the collector, keep nothing."""
        profile, self._profile = self._profile, None
        if profile is not None:
            try:
                profile.disable()
            finally:
                self._resume_gc()

    def _resume_gc(self) -> None:
        if self._gc_was_on:
            gc.enable()
            self._gc_was_on = False


def _callers(entries: list[Any]) -> dict[Any, list[tuple[Any, int]]]:
    """Each profiled function's callers and how often each called it."""
    callers: dict[Any, list[tuple[Any, int]]] = {}
    for e in entries:
        for sub in e.calls or ():
            if not isinstance(sub.code, str):
                callers.setdefault(sub.code, []).append((e.code, int(sub.callcount)))
    return callers


def _count_made_code_as_libraries(kinds: dict[Any, tuple[str, str]],
                                  callers: dict[Any, list[tuple[Any, int]]]) -> None:
    """Code a library made at run time ("<string>": a dataclass's ``__init__``) and only
    libraries call counts as theirs, not the user's."""
    for code, by in callers.items():
        if (kinds[code][0] == USER and code.co_filename.startswith("<") and by
                and all(kinds.get(c, (USER, ""))[0] in (LIBRARY, STDLIB) for c, _ in by)):
            kinds[code] = (LIBRARY, kinds[code][1])


def _ours(kinds: dict[Any, tuple[str, str]],
          callers: dict[Any, list[tuple[Any, int]]]) -> set[Any]:
    """traceml-ci's functions and a DataLoader iterator's, and what only those (or what only
    such a function) call."""
    ours = {code for code, (kind, _) in kinds.items()
            if kind == OWN or code.co_filename.replace("\\", "/").endswith(INPUT_PIPELINE)}
    grown = True
    while grown:
        grown = False
        for code, by in callers.items():
            if code not in ours and by and all(c in ours for c, _ in by):
                ours.add(code)
                grown = True
    return ours


def calls_block(stats: Any, sites: Sites) -> dict[str, Any]:
    """The ``counters.python`` block from cProfile's entries: calls per step, the user's and
    the libraries' (installed packages, torch, the standard library), the user functions
    called most (``file:line`` of their ``def``). traceml-ci's own calls are left out, and so
    are the calls it makes (and a DataLoader iterator's, ``INPUT_PIPELINE``): a function only
    those (or such a function) call is left out whole -- the tracer's housekeeping reads
    psutil on the training thread at moments the clock decides --, one that others call too
    loses the calls those made."""
    entries = [e for e in stats if not isinstance(e.code, str)]  # builtins are not profiled
    kinds = {e.code: sites.where(e.code.co_filename) for e in entries}
    callers = _callers(entries)
    _count_made_code_as_libraries(kinds, callers)
    ours = _ours(kinds, callers)
    user = library = 0
    top: dict[str, tuple[int, str]] = {}
    for e in entries:
        code = e.code
        if code in ours:
            continue
        n = int(e.callcount) - sum(k for c, k in callers.get(code, ()) if c in ours)
        if n <= 0:
            continue
        kind, shown = kinds[code]
        if kind == USER:
            user += n
            at = f"{shown}:{code.co_firstlineno}"
            name = getattr(code, "co_qualname", code.co_name)
            seen = top.get(at, (0, name))
            top[at] = (seen[0] + n, name)
        elif kind in (LIBRARY, STDLIB):
            library += n
    named = sorted(top.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_FUNCTIONS]
    out: dict[str, Any] = {"per_step": user + library, "user": user, "library": library}
    if named:
        out["top_user"] = [{"at": at, "function": name, "calls": n} for at, (n, name) in named]
    return out
