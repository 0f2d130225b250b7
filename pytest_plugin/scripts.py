"""Run a training script traced in a child process (the launcher, as a library) and read its
summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_plugin.summaries import read_summary
from traceml_ci.summary.keys import SUMMARY_FILENAME

#: The last lines of the script's output shown when it fails.
OUTPUT_TAIL_LINES = 30


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
    nproc_per_node: int | None = None,
    module_sample_s: float | None = None,
    root_dir: Path | None = None,
) -> dict[str, Any]:
    """``script args`` traced in a child interpreter, as ``traceml-ci run --out out_dir`` runs
    it; returns the summary document it wrote (not yet validated). ``nproc_per_node``: launch
    that many ranks through torchrun on a free local port; the summary is rank 0's merged one.
    ``module_sample_s``: the child's module sample period unless its environment sets one.
    ``root_dir``: what the summary's ``file:line`` sites are relative to (pytest's rootdir)."""
    from traceml_ci.childenv import child_env
    from traceml_ci.errors import MissingDependencyError
    from traceml_ci.tracer.launch import LaunchSpec, launch

    spec = LaunchSpec(
        target=str(script),
        args=tuple(map(str, args)),
        out_dir=str(out_dir),
        run_name=run_name,
        warmup_steps=warmup_steps,
        root_dir=str(root_dir) if root_dir is not None else None,
        torchrun=(() if nproc_per_node is None else
                  ("--nproc-per-node", str(nproc_per_node), "--master-port", str(free_port()))),
    )
    from traceml_ci.summary.keys import ENV_MODULE_SAMPLE

    run_env = child_env(changes=env)
    if module_sample_s is not None:
        run_env.setdefault(ENV_MODULE_SAMPLE, repr(module_sample_s))
    try:
        done = launch(spec, env=run_env, cwd=cwd, timeout_s=timeout_s, capture=True)
    except MissingDependencyError as exc:
        raise ScriptFailed(f"traceml: {exc}") from None
    if done.timed_out:
        raise ScriptFailed(f"traceml: {script} did not finish within {timeout_s} s")
    if done.code != 0:
        raise ScriptFailed(f"traceml: {script} exited with code {done.code}\n" + _tail(done.output))
    path = out_dir / SUMMARY_FILENAME
    if not path.is_file():
        raise ScriptFailed(f"traceml: {script} left no summary at {path}\n" + _tail(done.output))
    return read_summary(path)


def free_port() -> int:
    """A TCP port free on this host now, for a local torchrun rendezvous (another process could
    take it before torchrun binds it; the window is short)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(output: str | None) -> str:
    lines = (output or "").rstrip().splitlines()
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])
