"""Process lifecycle: finish at exit, and tell completed from crashed from interrupted."""

from __future__ import annotations

import atexit
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from traceml_ci.summary.model import RunStatus

_installed = False


def install(get_tracer: Callable[[], Any]) -> None:
    """Once per process: atexit finish, an excepthook that records crashes, and SIGTERM -> exit.

    SIGTERM's default action kills the process without running atexit; turning it into
    SystemExit(143) lets the summary be written with status "interrupted".
    """
    global _installed
    if _installed:
        return
    _installed = True

    def at_exit() -> None:
        tracer = get_tracer()
        if tracer is not None:
            tracer.finish()

    atexit.register(at_exit)

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


def _on_sigterm(get_tracer: Callable[[], Any]) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        tracer = get_tracer()
        if tracer is not None and tracer.status is None:
            tracer.status = RunStatus.INTERRUPTED
        raise SystemExit(128 + signum)

    return handler


def status_for_exception(exc_type: Any) -> RunStatus:
    if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
        return RunStatus.INTERRUPTED
    return RunStatus.CRASHED
