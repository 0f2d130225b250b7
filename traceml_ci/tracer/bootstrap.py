"""The traced child that ``traceml-ci run`` and the pytest plugin start
(``python -m traceml_ci.tracer.bootstrap``).

It reads its LaunchSpec once, from ``$TRACEML_CI_LAUNCH`` (``config.take_launch_spec``), and
runs the script (or ``-m`` module) as ``__main__`` exactly as ``python`` would; its exit code
is ours. The tracer starts when the script first imports torch (or calls ``init()``): a
script that never does is run without importing torch, and gets a summary with no steps.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import runpy
import signal
import sys
import time
import traceback
from typing import Any

from traceml_ci.summary.model import RunStatus
from traceml_ci.tracer import api, lifecycle
from traceml_ci.tracer.config import TracerConfig, take_launch_spec
from traceml_ci.tracer.launch import ENV_LAUNCH, LaunchSpec
from traceml_ci.tracer.warn import warn


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first ``import torch`` it wraps torch's loader so the armed
    tracer starts right after torch's own import finishes, before the script uses it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:  # pragma: no cover - already removed
            return None
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        real = loader.exec_module

        def exec_module(module: Any) -> None:
            real(module)
            try:
                api.start_armed()
            except Exception as exc:  # the tracer never breaks the user's script
                warn(f"tracing could not start ({exc!r})")

        loader.exec_module = exec_module  # this loader instance serves this one import only
        return spec


def _print_user_traceback(exc: BaseException) -> None:
    """The traceback as ``python SCRIPT`` prints it: without our and runpy's frames on top."""
    tb = exc.__traceback__
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    while tb is not None and _where(tb.tb_frame.f_code.co_filename) in ours:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def _where(filename: str) -> str:
    return filename if filename.startswith("<") else os.path.abspath(filename)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1, like Python
    return 1


def _config(spec: LaunchSpec) -> TracerConfig:
    options: dict[str, Any] = {"out_dir": spec.out, "run_name": spec.name, "locked": spec.locked}
    for name in ("warmup_steps", "max_steps", "batch_size", "module_sample_s", "root_dir"):
        if getattr(spec, name) is not None:  # None: left to init() and the defaults
            options[name] = getattr(spec, name)
    return TracerConfig(**options)


def _run(spec: LaunchSpec) -> None:
    if spec.module:
        sys.argv = [spec.target, *spec.args]  # run_module puts the module's path in argv[0]
        sys.path[0] = os.getcwd()  # as `python -m` does
        runpy.run_module(spec.target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [spec.target, *spec.args]
        sys.path[0] = os.path.dirname(os.path.abspath(spec.target))
        runpy.run_path(spec.target, run_name="__main__")


def main() -> int:
    raw = take_launch_spec()
    if not raw:
        print(
            f"traceml-ci: {__name__} runs under `traceml-ci run` (no ${ENV_LAUNCH})",
            file=sys.stderr,
        )
        return 2
    spec = LaunchSpec.from_json(raw)
    started = time.time()
    # From the start, torch or not: a SIGTERM writes an "interrupted" summary, then ends us.
    lifecycle.install(lambda: _finish(spec, started, RunStatus.INTERRUPTED), api.current)
    sys.meta_path.insert(0, _AfterTorchImport())
    api.arm(_config(spec))
    status, code = RunStatus.COMPLETED, 0
    try:
        _run(spec)
    except SystemExit as exc:
        code = _exit_code(exc.code)
        status = RunStatus.COMPLETED if code == 0 else RunStatus.CRASHED
    except KeyboardInterrupt as exc:
        _print_user_traceback(exc)
        status, code = RunStatus.INTERRUPTED, 130
    except BaseException as exc:
        _print_user_traceback(exc)
        status, code = RunStatus.CRASHED, 1
    finally:
        # The script is over: a late SIGINT (a second Ctrl-C, a group signal passed on) must
        # not cut the summary's write short.
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        _finish(spec, started, status)
    return code


_finished = False


def _finish(spec: LaunchSpec, started: float, status: RunStatus) -> None:
    """Write the run's summary once: the tracer's, or one without steps if torch never came.
    (Also the at-exit and SIGTERM finish: those pass "interrupted", which a tracer that
    already finished ignores.)"""
    global _finished
    if _finished:
        return
    _finished = True
    with lifecycle.finishing():
        _write(spec, started, status)


def _write(spec: LaunchSpec, started: float, status: RunStatus) -> None:
    tracer = api.current()
    if tracer is not None:
        # A SIGTERM already said "interrupted"; keep that over what the unwinding looked like.
        api.finish(tracer.status or status)
        return
    if not api.armed():  # a tracer ran, and the script stopped it itself
        return
    # The script never imported torch: nothing to trace, but the run still has an outcome.
    from traceml_ci.tracer.fallback import write_fallback_summary

    with lifecycle.claim(spec.summary_path, started) as (where, diverted):
        path = write_fallback_summary(where, spec.name, started, status, mode="zero-change")
    said = (
        f"another process wrote {spec.summary_path} during this run; this one's summary went "
        f"to {path}"
        if diverted
        else f"summary written to {path}"
    )
    print(
        f"traceml-ci: the script never imported torch, so no steps were traced; {said}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
