"""Process lifecycle: which process owns the run, finish at exit, tell completed from crashed from
interrupted, and write the summary without clobbering one another process finished. Torch-free."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from traceml_ci.summary.model import RunStatus

_installed = False
#: The first SIGTERM starts the exit; later ones (a group SIGTERM plus the launcher passing it
#: on) must not interrupt the unwinding and the summary's write.
_terminating = False


def owns_run() -> bool:
    """False in processes that must never trace or write: a DataLoader worker, and a child of
    multiprocessing (spawn, forkserver) while it re-imports the user's main script -- which
    re-runs a top-level ``init()``. A rank started by ``torch.multiprocessing.spawn`` calls
    ``init()`` from its function, after that re-import, and does own its run."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.utils.data.get_worker_info() is not None:
                return False
        except Exception:  # a half-imported torch: nothing to ask yet
            pass
    # spawn's (and forkserver's) _main sets _inheriting while it re-imports the script as
    # __mp_main__; _bootstrap, which runs the worker, only comes after. (A name check would
    # not do: users may rename the main process, and multiprocessing aliases __mp_main__ to
    # __main__ in every process.)
    mp = sys.modules.get("multiprocessing")
    return not (mp is not None and getattr(mp.current_process(), "_inheriting", False))


def install(finish_at_exit: Callable[[], None], get_tracer: Callable[[], Any]) -> None:
    """Once per process: ``finish_at_exit`` at exit, an excepthook that records crashes, and
    SIGTERM -> exit.

    SIGTERM's default action kills the process without running atexit; turning it into
    SystemExit(143) lets the summary be written with status "interrupted".
    """
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(finish_at_exit)

    previous_hook = sys.excepthook

    def excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
        tracer = get_tracer()
        if tracer is not None and tracer.status is None:
            tracer.status = status_for_exception(exc_type)
        previous_hook(exc_type, exc, tb)

    sys.excepthook = excepthook

    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm(get_tracer))
        except (ValueError, OSError):  # pragma: no cover - exotic embedders
            pass


def terminating() -> bool:
    """Whether a SIGTERM has started this process's exit."""
    return _terminating


def _on_sigterm(get_tracer: Callable[[], Any]) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        global _terminating
        if _terminating:
            return
        _terminating = True
        tracer = get_tracer()
        if tracer is not None and tracer.status is None:
            tracer.status = RunStatus.INTERRUPTED
        # A group SIGTERM also kills DataLoader workers; torch's SIGCHLD handler would then
        # raise "worker exited unexpectedly" into the unwinding. We are leaving anyway.
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
            pass
        raise SystemExit(128 + signum)

    return handler


def status_for_exception(exc_type: Any) -> RunStatus:
    if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
        return RunStatus.INTERRUPTED
    return RunStatus.CRASHED


@contextmanager
def claim(summary: Path, started: float) -> Iterator[tuple[Path, bool]]:
    """Where this process may write its summary, decided and written under the folder's lock:
    ``(summary, False)``, or -- when another process wrote ``summary`` after ``started``
    (wall-clock seconds), i.e. during this run -- ``(<folder>/pid-<pid>/<name>, True)``.
    A run that starts after a finished one still replaces it."""
    folder = summary.parent
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the atomic replace still holds
        fcntl = None
    fd = os.open(folder, os.O_RDONLY) if fcntl is not None else None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        if _written_since(summary, started):
            yield folder / f"pid-{os.getpid()}" / summary.name, True
        else:
            yield summary, False
    finally:
        if fd is not None:
            os.close(fd)  # closing releases the lock


def _written_since(path: Path, started: float) -> bool:
    try:
        return path.stat().st_mtime >= started
    except OSError:
        return False
