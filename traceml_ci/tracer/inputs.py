"""The input pipeline's work per batch, counted: ATen ops by kind, FLOPs, new storages and
Python calls in ``Dataset.__getitem__`` (the fetch) and in ``collate_fn``, in the DataLoader's
worker processes too -- so a heavier augmentation or a Python collate is a count, not a time.

**Which batch.** One batch per run, chosen by a rule that gives the same batch on every run of
the same code: the *second* batch a fetching process makes (its first pays one-off costs: a file
opened, a lazy import, a cache filled) -- with ``num_workers=0`` the main process's second fetch
of the iterator, with workers worker 0's second fetch. The figures are per batch, so 1, 2 or 8
workers give the same ones. Iterators are armed from the run's first on, until one's count is
taken; of those taken, the first armed wins.

**Workers** are separate processes (fork on Linux, spawn elsewhere). While an iterator is made,
torch's ``_worker_loop`` (which ``_MultiProcessingDataLoaderIter`` looks up as it starts its
workers) is replaced by ``functools.partial(counted_worker_loop, ticket)``: a module-level
function, so it pickles by reference under spawn. In worker 0 it wraps torch's dataset fetchers'
``fetch`` for that process, counts the second call, puts the fetchers back and writes the counts
as a small JSON file (written atomically) into a folder the tracer owns; then it runs torch's
loop, untouched. The batches, the user's objects and the RNG streams are never touched. A count
is taken only once the main process has *received* worker 0's second batch
(``_process_data``, wrapped until then): a report still being written when the run ends is left
out on every run alike.

**Counting** is a ``TorchDispatchMode`` on that one fetch (the ops as dispatch sees them, after
composite decompositions; each kind with the user's line that ran the most of it, via
tracer/sites.py), with torch's FLOP formulas (``torch.utils.flop_counter``); a *new storage* is
one an op returned that none of its inputs held (a ``torch.tensor(...)`` copy counts, a
``from_numpy`` view does not). Python calls (``sys.setprofile``: function calls, not C calls)
are split into the user's code and the libraries' (torch, the standard library, installed
packages); the calls torch makes because a dispatch mode is on (``torch/_library``,
``torch/_ops.py``, ``utils/_python_dispatch.py``) and ours are left out, and the garbage
collector waits for the batch to end, so the count is the same on every run. Work outside torch
(numpy, PIL) shows in the Python calls only. Only the counted batch pays; any failure of ours
leaves that batch to torch, uncounted, with one warning.

``num_workers=0`` and ``> 0`` differ in what torch's default collate does (in a worker it stacks
into shared memory: an ``empty``/``set_``/``resize_`` more), never between worker counts.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import Any

from traceml_ci.tracer.counters import kinds_block
from traceml_ci.tracer.sites import OWN, STDLIB, USER, Sites

#: The fetch counted, per fetching process (1-based): the first pays one-off costs.
COUNTED_FETCH = 2
#: Op kinds listed per part (the most run first; the rest summed in ``other``): a pipeline
#: runs a handful, and the summary stays small (~0.8 KB for the block).
TOP_INPUT_KINDS = 8
#: The two parts of a batch, in the summary.
PARTS = ("fetch", "collate")
#: Longest dataset name kept.
MAX_NAME = 256
#: torch's own Python that dispatch calls because a mode is on: not the pipeline's calls.
_DISPATCH_PATHS = (os.path.join("torch", "_library") + os.sep,
                   os.path.join("torch", "_ops.py"),
                   os.path.join("torch", "utils", "_python_dispatch.py"))
#: torch's wrappers a dispatch mode is called through: never the line that ran an op.
_WRAPPERS = tuple(os.path.join(*p) for p in (
    ("_dynamo", "eval_frame.py"), ("torch", "_compile.py"), ("utils", "_python_dispatch.py"),
    ("torch", "_ops.py")))

Warn = Callable[[str], None]


class _Part:
    """What one part (fetch or collate) of the counted batch did."""

    __slots__ = ("ops", "allocs", "alloc_bytes", "flops", "user_calls", "library_calls")

    def __init__(self) -> None:
        #: (op kind, file:line) -> times run.
        self.ops: dict[tuple[str, str], int] = {}
        self.allocs = 0
        self.alloc_bytes = 0
        self.flops = 0
        self.user_calls = 0
        self.library_calls = 0

    def block(self, calls: bool) -> dict[str, Any]:
        out = kinds_block(self.ops, TOP_INPUT_KINDS, "per_batch")
        if not out["other"]:
            del out["other"]
        out.update(allocs=self.allocs, alloc_bytes=self.alloc_bytes)
        if self.flops:
            out["flops"] = self.flops
        if calls:
            out["calls"] = {"user": self.user_calls, "library": self.library_calls}
        return out


class BatchCount:
    """Counts one fetch: ``run(fetcher, fetch, index)`` returns what ``fetch`` returns (or
    raises what it raises); ``block()`` is the summary's ``input`` block (None: not counted)."""

    def __init__(self, sites: Sites, workers: int) -> None:
        self.sites = sites
        self.workers = workers
        self.parts = {p: _Part() for p in PARTS}
        self.part = self.parts["fetch"]
        self.samples: int | None = None
        self.dataset = ""
        #: Python calls counted (False: another profiler was on; they are left out).
        self.calls = False
        #: A count of ours failed midway: the batch's figures are incomplete, so none is kept.
        self.broken = False
        self.done = False
        self._thread = 0
        self._skip = 0
        self._skip_code: Any = None
        #: The counted fetch's own frame: sites are looked for above it only.
        self._stop: Any = None
        self._dispatch_paths: tuple[str, ...] = ()

    # -- the counted fetch --------------------------------------------------------------------
    def run(self, fetcher: Any, fetch: Callable[[Any, Any], Any], index: Any) -> Any:
        collate = fetcher.collate_fn
        count = self

        def collate_counted(data: Any) -> Any:
            try:
                count.samples = len(data) if fetcher.auto_collation else 1
            except Exception:
                count.samples = None
            count.part = count.parts["collate"]
            return collate(data)

        try:
            mode = _mode_class()(self)
            self._thread = threading.get_ident()
            self._skip_code = mode.__torch_dispatch__.__code__
            self._dispatch_paths = _dispatch_paths()
            self.dataset = _dataset_name(fetcher)
            self.calls = sys.getprofile() is None
            self._stop = sys._getframe()
        except Exception:  # never into the user's data loading: this batch goes uncounted
            self.broken = True
            return fetch(fetcher, index)
        gc_was = gc.isenabled()
        entered = False

        def restore() -> None:
            if self.calls:
                sys.setprofile(None)
            if gc_was:
                gc.enable()
            fetcher.collate_fn = collate
            if entered:
                try:
                    mode.__exit__(None, None, None)
                except Exception:
                    self.broken = True
            self._stop = None

        try:
            fetcher.collate_fn = collate_counted
            mode.__enter__()
            entered = True
            gc.disable()  # a collection's finalizers would run inside the batch, or not
            if self.calls:
                sys.setprofile(self._profile)
        except Exception:  # never into the user's data loading: this batch goes uncounted
            self.broken = True
            restore()
            return fetch(fetcher, index)
        try:
            out = fetch(fetcher, index)
        finally:
            restore()
        self.done = True
        return out

    def block(self) -> dict[str, Any] | None:
        if not self.done or self.broken:
            return None
        out: dict[str, Any] = {"batch": COUNTED_FETCH, "workers": self.workers}
        if self.samples is not None:
            out["samples"] = self.samples
        if self.dataset:
            out["dataset"] = self.dataset
        out.update((p, self.parts[p].block(self.calls)) for p in PARTS)
        return out

    # -- what the mode and the profiler call ----------------------------------------------------
    def note_op(self, func: Any, args: Any, kwargs: Any, out: Any, before: set[int]) -> None:
        import torch

        if threading.get_ident() != self._thread:
            return
        part = self.part
        name = func.overloadpacket.__name__
        key = (name, self.site(sys._getframe(1)))
        part.ops[key] = part.ops.get(key, 0) + 1
        fresh = name in ("lift_fresh", "lift_fresh_copy")  # torch.tensor(...): a new copy
        seen: set[int] = set()
        for t in _leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if not nbytes or ptr in seen:
                continue
            seen.add(ptr)
            if ptr not in before or (fresh and storage.resizable()):
                part.allocs += 1
                part.alloc_bytes += nbytes
        formula = _flop_registry().get(func.overloadpacket)
        if formula is not None:
            try:
                part.flops += int(formula(*args, **kwargs, out_val=out))
            except Exception:  # an op torch's formula cannot take: its FLOPs left out
                pass

    def site(self, frame: Any) -> str:
        """As ``Sites.site``, up to the counted fetch: the user's nearest line inside it, else
        the nearest library's (not torch's, then torch's, then the standard library's) -- never
        a frame below the fetch (in a forked worker, the main process's line that started it;
        in a spawned one, spawn's own), so every start method shows the same line."""
        finder, stop = self.sites, self._stop
        fallback: dict[int, str] = {}
        while frame is not None and frame is not stop:
            filename = frame.f_code.co_filename
            kind, shown = finder.where(filename)
            if kind == USER:
                return f"{shown}:{frame.f_lineno}"
            if kind != OWN and not filename.endswith(_WRAPPERS):
                rank = 2 if kind == STDLIB else 1 if finder.is_torch(filename) else 0
                fallback.setdefault(rank, f"{shown}:{frame.f_lineno}")
            frame = frame.f_back
        return fallback[min(fallback)] if fallback else "?"

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            if self._skip:
                self._skip += 1
                return
            code = frame.f_code
            filename = code.co_filename
            if code is self._skip_code or any(p in filename for p in self._dispatch_paths):
                self._skip = 1  # our mode, or torch's dispatch machinery: its calls too
                return
            kind = self.sites.where(filename)[0]
            if kind == USER:
                self.part.user_calls += 1
            elif kind != OWN:
                self.part.library_calls += 1
        elif event == "return" and self._skip:
            self._skip -= 1


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [value]


def _dispatch_paths() -> tuple[str, ...]:
    torch = sys.modules.get("torch")
    root = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))) if torch else ""
    return tuple(os.path.join(root, p) for p in _DISPATCH_PATHS)


def _dataset_name(fetcher: Any) -> str:
    """``SyntheticImages.__getitem__``: the method the fetch runs per sample."""
    dataset = fetcher.dataset
    if hasattr(fetcher, "dataset_iter"):
        method = "__iter__"
    elif getattr(fetcher, "auto_collation", False) and getattr(dataset, "__getitems__", None):
        method = "__getitems__"
    else:
        method = "__getitem__"
    return f"{type(dataset).__qualname__}.{method}"[:MAX_NAME]


_FLOPS: Any = None


def _flop_registry() -> Any:
    global _FLOPS
    if _FLOPS is None:
        try:
            from torch.utils.flop_counter import flop_registry

            _FLOPS = flop_registry
        except Exception:  # an old torch without it: no FLOPs, the rest counted
            _FLOPS = {}
    return _FLOPS


_MODE_CLASS: Any = None


def _mode_class() -> Any:
    """The dispatch mode (built on first use: torch is imported then)."""
    global _MODE_CLASS
    if _MODE_CLASS is not None:
        return _MODE_CLASS
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    strided = torch.strided
    tensor = torch.Tensor

    class InputCountMode(TorchDispatchMode):  # type: ignore[misc]
        def __init__(self, count: BatchCount) -> None:
            super().__init__()
            self.count = count

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            count = self.count
            before: set[int] = set()
            try:
                for t in _leaves(list(args) + list(kwargs.values())):
                    if isinstance(t, tensor) and t.layout == strided:
                        before.add(t.untyped_storage().data_ptr())
            except Exception:
                count.broken = True
            out = func(*args, **kwargs)
            try:
                count.note_op(func, args, kwargs, out, before)
            except Exception:  # never into the user's data loading
                count.broken = True
            return out

    _MODE_CLASS = InputCountMode
    return _MODE_CLASS


# -- worker processes ---------------------------------------------------------------------------
#: What a worker is handed (picklable): (report folder, iterator number, run root).
Ticket = tuple[str, int, str]


def report_path(folder: str, seq: int) -> str:
    return os.path.join(folder, f"input-{seq}.json")


def counted_worker_loop(ticket: Ticket, *args: Any, **kwargs: Any) -> None:
    """torch's ``_worker_loop``, with worker 0's second fetch counted (see the module
    docstring). Whatever fails here leaves the worker to torch, uncounted."""
    from torch.utils.data._utils import worker as worker_mod

    loop = _ORIGINAL_LOOP if _ORIGINAL_LOOP is not None else worker_mod._worker_loop
    try:
        worker_id = kwargs["worker_id"] if "worker_id" in kwargs else args[10]
        workers = kwargs["num_workers"] if "num_workers" in kwargs else args[11]
        if worker_id == 0:
            _arm_worker(ticket, int(workers))
    except Exception as exc:
        _warn_worker(f"input pipeline not counted ({exc!r})")
    return loop(*args, **kwargs)


def _warn_worker(message: str) -> None:
    from traceml_ci.tracer.warn import warn

    warn(message)


def _arm_worker(ticket: Ticket, workers: int) -> None:
    """Wrap this process's dataset fetchers' ``fetch`` until its ``COUNTED_FETCH``-th call."""
    from torch.utils.data._utils import fetch as fetch_mod

    folder, seq, root = ticket
    classes = (fetch_mod._MapDatasetFetcher, fetch_mod._IterableDatasetFetcher)
    saved = [(cls, cls.__dict__["fetch"]) for cls in classes]
    calls = [0]

    def restore() -> None:
        for cls, original in saved:
            cls.fetch = original

    def wrap(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def fetch(fetcher: Any, index: Any) -> Any:
            calls[0] += 1
            if calls[0] < COUNTED_FETCH:
                return original(fetcher, index)
            restore()
            try:
                count = BatchCount(Sites(root), workers)
            except Exception as exc:
                _warn_worker(f"input pipeline not counted ({exc!r})")
                return original(fetcher, index)
            out = count.run(fetcher, original, index)
            try:
                block = count.block()
                if block is None:
                    _warn_worker("input pipeline not counted (the count failed midway)")
                else:
                    _write_report(report_path(folder, seq), block)
            except Exception as exc:
                _warn_worker(f"input pipeline count not reported ({exc!r})")
            return out

        fetch.__wrapped__ = original  # type: ignore[attr-defined]
        return fetch

    for cls, original in saved:
        cls.fetch = wrap(original)


def _write_report(path: str, block: dict[str, Any]) -> None:
    """``block`` as JSON at ``path``, whole or not at all (a temporary file, then a rename)."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".input-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(block, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


#: torch's loop, as found when the main process first armed a worker (a forked worker inherits
#: it; a spawned one imports torch afresh and finds torch's own).
_ORIGINAL_LOOP: Any = None


# -- the main process ---------------------------------------------------------------------------
class _Armed:
    """An iterator with workers whose count is awaited: worker 0's batches received so far."""

    __slots__ = ("ref", "seq", "received", "needed", "by_worker")

    def __init__(self, it: Any, seq: int, needed: int, by_worker: bool) -> None:
        self.ref = weakref.ref(it)
        self.seq = seq
        self.received = 0
        self.needed = needed
        self.by_worker = by_worker


class InputProbe:
    """Counts the input pipeline of one run: ``install()`` with the auto-mode patches,
    ``uninstall()`` when tracing stops (every patch restored), ``record()`` the summary's
    ``counters.input`` block (None: nothing counted). Never raises into the user's code."""

    def __init__(self, warn: Warn, root: Any = None) -> None:
        self._warn = warn
        self._root = root
        self._pid = os.getpid()
        self._undo: list[Callable[[], None]] = []
        self._folder: str | None = None
        self._root_shown: str | None = None
        self._seq = 0
        #: id(iterator) -> its wait for worker 0's second batch.
        self._awaiting: dict[int, _Armed] = {}
        #: iterator number -> its block (the main process's count), or None (a worker's report).
        self._taken: dict[int, dict[str, Any] | None] = {}
        self._process_undo: Callable[[], None] | None = None
        #: Whether torch's ``_process_data`` names the worker (2.6+: ``in_order``).
        self._by_worker = True
        self._warned = False
        #: A count of ours failed in this process: no iterator is armed any more.
        self._failed = False
        self._block: dict[str, Any] | None = None
        self._recorded = False

    @property
    def installed(self) -> bool:
        return bool(self._undo)

    def install(self) -> None:
        if self._undo or self._recorded:
            return
        try:
            from torch.utils.data import dataloader

            self._root_shown = Sites(self._root).root
            single = dataloader._SingleProcessDataLoaderIter
            multi = dataloader._MultiProcessingDataLoaderIter
            self._wrap_init(single, self._armed_single)
            self._wrap_init(multi, None)
        except Exception as exc:
            self.uninstall()
            self._warn_once(f"input pipeline not counted ({exc!r})")

    def uninstall(self) -> None:
        undo = self._undo + ([self._process_undo] if self._process_undo else [])
        self._undo, self._process_undo = [], None
        for restore in reversed(undo):
            try:
                restore()
            except Exception:  # pragma: no cover - restoring must not raise either
                pass
        self._awaiting.clear()

    def discard(self) -> None:
        """The tracer is forgotten: every patch restored, the report folder removed, nothing
        recorded from now on (a finished run's block is kept)."""
        self.uninstall()
        self._recorded = True
        self._remove_folder()

    def _remove_folder(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def record(self) -> dict[str, Any] | None:
        """The ``counters.input`` block: the first armed iterator's count that was taken. Read
        once (the report folder is removed then)."""
        if self._recorded:
            return self._block
        self._recorded = True
        self.uninstall()
        try:
            if self._taken:
                seq = min(self._taken)
                block = self._taken[seq]
                if block is None and self._folder is not None:
                    block = _read_report(report_path(self._folder, seq))
                    if block is None:
                        self._warn_once("input pipeline not counted (a worker's count was lost)")
                self._block = block
        except Exception as exc:
            self._warn_once(f"input pipeline count left out ({exc!r})")
        finally:
            self._remove_folder()
        return self._block

    # -- iterators ------------------------------------------------------------------------------
    def _wrap_init(self, cls: type, after: Callable[[Any, int], None] | None) -> None:
        original = cls.__dict__["__init__"]
        probe = self

        def __init__(it: Any, *args: Any, **kwargs: Any) -> None:
            seq = probe._arming()
            if seq is None:
                return original(it, *args, **kwargs)
            if after is not None:
                original(it, *args, **kwargs)
                try:
                    after(it, seq)
                except Exception as exc:
                    probe._warn_once(f"input pipeline not counted ({exc!r})")
                return None
            probe._with_workers(it, seq, original, args, kwargs)
            return None

        functools.update_wrapper(__init__, original)
        cls.__init__ = __init__  # type: ignore[misc]
        self._undo.append(lambda: setattr(cls, "__init__", original))

    def _arming(self) -> int | None:
        """The number of the iterator being made, when it is to be armed (else None)."""
        try:
            if self._taken or self._failed or os.getpid() != self._pid:  # or a worker's loader
                return None
            seq = self._seq
            self._seq += 1
            return seq
        except Exception:
            return None

    def _armed_single(self, it: Any, seq: int) -> None:
        """``num_workers=0``: the iterator's fetcher counts its second fetch, here."""
        fetcher = it._dataset_fetcher
        if "fetch" in vars(fetcher):  # someone else's: leave it be
            return
        ref = weakref.ref(fetcher)
        calls = [0]
        probe = self

        def fetch(index: Any) -> Any:
            owner = ref()
            if owner is None:  # pragma: no cover - a fetcher is alive while it fetches
                raise RuntimeError("DataLoader fetcher gone")
            original = type(owner).fetch
            calls[0] += 1
            if calls[0] < COUNTED_FETCH:
                return original(owner, index)
            try:
                del owner.fetch  # from the next batch on, torch's own fetch alone
            except AttributeError:
                pass
            if not probe._may_take(seq):
                return original(owner, index)
            try:
                count = BatchCount(Sites(probe._root_shown), 0)
            except Exception as exc:
                probe._failed = True
                probe._warn_once(f"input pipeline not counted ({exc!r})")
                return original(owner, index)
            out = count.run(owner, original, index)
            block = count.block()
            if block is None:
                probe._failed = True
                probe._warn_once("input pipeline not counted (the count failed midway)")
            elif probe._may_take(seq):
                probe._take(seq, block)
            return out

        fetcher.fetch = fetch

    def _with_workers(self, it: Any, seq: int, original: Callable[..., None],
                      args: tuple, kwargs: dict) -> None:
        """Make the iterator with worker 0 counting, then wait for its second batch."""
        global _ORIGINAL_LOOP
        try:
            from torch.utils.data._utils import worker as worker_mod

            folder = self._report_folder()
            loop = worker_mod.__dict__["_worker_loop"]
            _ORIGINAL_LOOP = loop  # what a forked worker runs after arming
            worker_mod._worker_loop = functools.partial(
                counted_worker_loop, (folder, seq, self._root_shown or ""))
        except Exception as exc:
            self._warn_once(f"input pipeline not counted ({exc!r})")
            return original(it, *args, **kwargs)
        try:
            original(it, *args, **kwargs)
        finally:
            worker_mod._worker_loop = loop
        try:
            self._await(it, seq)
        except Exception as exc:
            self._warn_once(f"input pipeline not counted ({exc!r})")
        return None

    def _report_folder(self) -> str:
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="traceml-ci-input-")
        return self._folder

    def _await(self, it: Any, seq: int) -> None:
        import inspect

        from torch.utils.data import dataloader

        cls = dataloader._MultiProcessingDataLoaderIter
        if self._process_undo is None:
            original = cls.__dict__["_process_data"]
            by_worker = len(inspect.signature(original).parameters) >= 3
            probe = self

            def _process_data(it: Any, data: Any, *rest: Any) -> Any:
                try:
                    probe._received(it, rest[0] if rest else None)
                except Exception as exc:
                    probe._warn_once(f"input pipeline not counted ({exc!r})")
                return original(it, data, *rest)

            functools.update_wrapper(_process_data, original)
            cls._process_data = _process_data
            self._process_undo = lambda: setattr(cls, "_process_data", original)
            self._by_worker = by_worker
        workers = int(getattr(it, "_num_workers", 1) or 1)
        # torch before in_order (2.6) names no worker: batches come in order, worker 0's
        # second is the iterator's number ``workers``.
        by_worker = self._by_worker
        needed = COUNTED_FETCH if by_worker else workers + 1
        self._awaiting[id(it)] = _Armed(it, seq, needed, by_worker)

    def _received(self, it: Any, worker: Any) -> None:
        """A batch from ``worker`` reached the main process: once worker 0's second has, its
        report is complete (written before that batch was sent)."""
        armed = self._awaiting.get(id(it))
        if armed is None or armed.ref() is not it:
            self._prune()
            return
        if armed.by_worker and worker != 0:
            return
        armed.received += 1
        if armed.received >= armed.needed:
            del self._awaiting[id(it)]
            if self._may_take(armed.seq):
                self._take(armed.seq, None)
            self._prune()

    def _may_take(self, seq: int) -> bool:
        """Whether iterator ``seq``'s count would be the one kept (the first armed wins)."""
        return not self._taken or seq < min(self._taken)

    def _take(self, seq: int, block: dict[str, Any] | None) -> None:
        self._taken[seq] = block
        self._prune()

    def _prune(self) -> None:
        """Forget the iterators that are gone or can no longer win; with none left, torch's
        ``_process_data`` is its own again."""
        for key, armed in list(self._awaiting.items()):
            if armed.ref() is None or not self._may_take(armed.seq):
                del self._awaiting[key]
        if self._process_undo is not None and not self._awaiting:
            undo, self._process_undo = self._process_undo, None
            undo()  # every batch from now on: torch's own

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self._warn(message)


def _read_report(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            block = json.load(f)
    except (OSError, ValueError):
        return None
    return block if isinstance(block, dict) else None
