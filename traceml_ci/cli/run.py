"""``traceml-ci run SCRIPT``: run a training script with tracing and write its summary."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from traceml_ci.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a training script with tracing",
        description="Run SCRIPT with tracing, whether or not it calls traceml_ci.init(), and "
        "write DIR/final_summary.json. Exits with the script's exit code. A crash still writes "
        "a summary (run.status 'crashed'); SIGINT/SIGTERM give 'interrupted'.",
    )
    p.add_argument(
        "--out", metavar="DIR", help="output folder (default $TRACEML_CI_OUT or ./traceml-out)"
    )
    p.add_argument("--run-name", metavar="NAME", help="run name (default: the script's name)")
    p.add_argument(
        "--warmup-steps", metavar="N", type=int, help="steps left out of the statistics (default 5)"
    )
    p.add_argument("script", metavar="SCRIPT", help="the Python training script")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for SCRIPT")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from traceml_ci.summary.keys import DEFAULT_OUT_DIR, ENV_OUT, SUMMARY_FILENAME
    from traceml_ci.tracer.config import ENV_RUN_NAME, ENV_WARMUP

    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"{script}: no such script")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise UsageError("--warmup-steps must be >= 0")
    env = dict(os.environ)
    locked = []
    out = Path(args.out or env.get(ENV_OUT) or DEFAULT_OUT_DIR)
    env[ENV_OUT] = str(out)
    if args.out:
        locked.append("out_dir")
    if args.run_name:
        env[ENV_RUN_NAME] = args.run_name
        locked.append("run_name")
    if args.warmup_steps is not None:
        env[ENV_WARMUP] = str(args.warmup_steps)
        locked.append("warmup_steps")
    env["TRACEML_CI_LOCKED"] = ",".join(locked)
    cmd = [sys.executable, "-m", "traceml_ci.tracer.bootstrap", str(script), *args.args]
    started = time.time()
    proc = subprocess.Popen(cmd, env=env)
    code = _wait_forwarding_signals(proc)
    summary = out / SUMMARY_FILENAME
    if not _written_since(summary, started):
        # The child died before it could write (SIGKILL, segfault, OOM killer): say so.
        from traceml_ci.cli.fallback import write_fallback_summary

        write_fallback_summary(
            summary, args.run_name or script.stem, started, interrupted=code in (130, 143)
        )
        print(
            f"traceml-ci: the script ended without a summary (exit {code}); "
            f"wrote {summary} with run.status set",
            file=sys.stderr,
        )
    else:
        print(f"traceml-ci: summary written to {summary}", file=sys.stderr)
    return code


def _wait_forwarding_signals(proc: subprocess.Popen) -> int:
    """Wait for the child; pass SIGTERM/SIGINT on so it can write an 'interrupted' summary."""

    def forward(signum: int, frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handler replaced above
                continue
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def _written_since(path: Path, started: float) -> bool:
    try:
        return path.stat().st_mtime >= started - 1.0
    except FileNotFoundError:
        return False
