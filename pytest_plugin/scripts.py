"""Run a training script under ``traceml-ci run`` in a subprocess and read its summary."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_plugin.summaries import read_summary
from traceml_ci.summary.keys import SUMMARY_FILENAME

#: The last lines of the script's output shown when it fails.
OUTPUT_TAIL_LINES = 30

_CLI = "import sys; from traceml_ci.cli.main import main; sys.exit(main(sys.argv[1:]))"


class ScriptFailed(Exception):
    """The script exited non-zero, timed out, or left no summary."""


def traced_script(
    script: Path,
    args: Sequence[str],
    *,
    out_dir: Path,
    run_name: str,
    warmup_steps: int | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> dict[str, Any]:
    """``traceml-ci run --out out_dir ... script args`` with this interpreter; returns the
    summary document it wrote (not yet validated)."""
    cmd = [sys.executable, "-c", _CLI, "run", "--out", str(out_dir), "--run-name", run_name]
    if warmup_steps is not None:
        cmd += ["--warmup-steps", str(warmup_steps)]
    cmd += [str(script), *map(str, args)]
    full_env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env, cwd=cwd
        )
    except subprocess.TimeoutExpired:
        raise ScriptFailed(f"traceml: {script} did not finish within {timeout_s} s") from None
    if proc.returncode != 0:
        raise ScriptFailed(
            f"traceml: {script} exited with code {proc.returncode}\n" + _tail(proc)
        )
    path = out_dir / SUMMARY_FILENAME
    if not path.is_file():
        raise ScriptFailed(f"traceml: {script} left no summary at {path}\n" + _tail(proc))
    return read_summary(path)


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    lines = ((proc.stdout or "") + (proc.stderr or "")).rstrip().splitlines()
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])
