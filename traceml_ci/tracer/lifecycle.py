"""Process lifecycle: which process owns the run, finish at exit, tell completed from crashed from
interrupted, and write the summary without clobbering one another process finished. Torch-free."""

from __future__ import annotations

import atexit
import contextlib
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
#: The first SIGTERM starts the exit; a second one (a group SIGTERM plus the launcher passing
#: it on) must not interrupt the summary's write.
_terminating = False
#: Summary writes under way (``finishing()``), and a SIGTERM that came during one.
_finishing = 0
_term_pending = False


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


def install(finish: Callable[[], None], get_tracer: Callable[[], Any]) -> None:
    """Once per process: ``finish`` at exit, an excepthook that records crashes, and a SIGTERM
    handler that finishes too.

    SIGTERM's default action kills the process without running atexit. The handler marks the
    run "interrupted", writes the summary, then dies of SIGTERM after all, as plain Python
    does: raising SystemExit instead would unwind from wherever the signal landed -- inside a
    DataLoader's queue or lock -- and could print tracebacks from its workers or hang.
    """
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(finish)

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
                signal.signal(signal.SIGTERM, _on_sigterm(finish, get_tracer))
        except (ValueError, OSError):  # pragma: no cover - exotic embedders
            pass


def terminating() -> bool:
    """Whether a SIGTERM has started this process's exit."""
    return _terminating


@contextmanager
def finishing() -> Iterator[None]:
    """Around a summary's write: a SIGTERM landing meanwhile waits until it is done."""
    global _finishing
    _finishing += 1
    try:
        yield
    finally:
        _finishing -= 1
        if not _finishing and _term_pending:
            _die(signal.SIGTERM)


def _on_sigterm(
    finish: Callable[[], None], get_tracer: Callable[[], Any]
) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        global _terminating, _term_pending
        if _finishing:  # the signal handler runs between two bytecodes of that very write
            _term_pending = True
            return
        if _terminating:
            return
        _terminating = True
        # A group SIGTERM also ends DataLoader workers; torch's SIGCHLD handler would raise
        # "worker killed by signal" in the middle of the write. We are leaving anyway.
        with contextlib.suppress(ValueError, OSError, AttributeError):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        tracer = get_tracer()
        if tracer is not None and tracer.status is None:
            tracer.status = RunStatus.INTERRUPTED
        try:
            finish()
        except BaseException:  # pragma: no cover - finish warns itself; we die regardless
            pass
        _die(signum)

    return handler


def _die(signum: int) -> None:
    """End the process by ``signum``'s default action, as if we had never caught it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # pragma: no cover - a closed stream
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


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
