"""Run a script under tracing: ``python -m traceml_ci.tracer.bootstrap SCRIPT [ARGS...]``.

Started by ``traceml-ci run`` in a child process. Settings come from TRACEML_CI_* variables;
those named in TRACEML_CI_LOCKED win over the script's own ``init()`` keywords. The script runs
as ``__main__`` exactly as ``python SCRIPT`` would; its exit code is ours.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

from traceml_ci.summary.model import RunStatus
from traceml_ci.tracer import api
from traceml_ci.tracer.config import (
    DEFAULT_OUT_DIR,
    DEFAULT_WARMUP_STEPS,
    ENV_OUT,
    ENV_RUN_NAME,
    ENV_WARMUP,
    TracerConfig,
)

ENV_LOCKED = "TRACEML_CI_LOCKED"


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1, like Python
    return 1


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m traceml_ci.tracer.bootstrap SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    config = TracerConfig(
        out_dir=Path(os.environ.get(ENV_OUT) or DEFAULT_OUT_DIR),
        run_name=os.environ.get(ENV_RUN_NAME) or Path(script).stem,
        warmup_steps=int(os.environ.get(ENV_WARMUP) or DEFAULT_WARMUP_STEPS),
        locked=frozenset(filter(None, os.environ.get(ENV_LOCKED, "").split(","))),
    )
    tracer = api.start(config, zero_change=True)
    status, code = RunStatus.COMPLETED, 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
        status = RunStatus.COMPLETED if code == 0 else RunStatus.CRASHED
    except KeyboardInterrupt:
        status, code = RunStatus.INTERRUPTED, 130
    except BaseException:
        traceback.print_exc()
        status, code = RunStatus.CRASHED, 1
    finally:
        tracer = api.current() or tracer
        # A SIGTERM already said "interrupted"; keep that over what the unwinding looked like.
        tracer.finish(tracer.status or status)
    return code


if __name__ == "__main__":
    sys.exit(main())
