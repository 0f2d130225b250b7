"""Escalation on demand: a regressed test runs once more under torch.profiler
(``--traceml-profile-on-regression``), and a baseline records each test's top ops
(``--traceml-update-baseline --traceml-profile``).

The profiled run is a job like the others (the test body in-process, or ``run_script``'s child)
with ``profile_steps`` set; its summary is never gated nor combined (the profiler's overhead is
in it). Whatever happens here, the verdict stays what the gate said: a failure to profile is one
warning line in the terminal summary.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_plugin.results import GateResult, Handling
from pytest_plugin.state import TracemlState

if TYPE_CHECKING:  # pragma: no cover
    from traceml_ci.gate.render.ops import ProfiledRun

#: Runs the job once more, writing under ``out_dir``, with this many steps profiled.
ProfileJob = Callable[[Path, int], object]

#: What a job can end with that is not ours to pass on: its own errors, and pytest's
#: fail/skip outcomes (BaseException subclasses) from a test body or a failed script.
_JOB_FAILURES: tuple[type[BaseException], ...] = (
    Exception, pytest.fail.Exception, pytest.skip.Exception, pytest.xfail.Exception)


class ProfileFailed(Exception):
    """The profiled run wrote no usable profile; the message says why (one line)."""


def after_gate(state: TracemlState, result: GateResult, message: str,
               job: ProfileJob | None) -> tuple[GateResult, str]:
    """What the profile options ask for this gated ``result`` (and its failure ``message``):
    a profile of a regression, or top ops for the baseline entry. Never changes a verdict."""
    opts = state.options
    if job is None:
        return result, message
    if opts.update_baseline:
        if opts.profile and result.handling is Handling.UPDATED and result.summary is not None:
            return _record_top_ops(state, result, job), message
        return result, message
    if opts.profile_on_regression and _regressed(result):
        return _escalate(state, result, message, job)
    return result, message


def _regressed(result: GateResult) -> bool:
    from traceml_ci.gate import Verdict

    return result.verdict is Verdict.REGRESSION


def _escalate(state: TracemlState, result: GateResult, message: str,
              job: ProfileJob) -> tuple[GateResult, str]:
    from traceml_ci.errors import InputError, one_line
    from traceml_ci.gate.render.ops import text_section
    from traceml_ci.summary.profile import summary_top_ops

    try:
        run = take_profile(state, result, job)
    except ProfileFailed as exc:
        return replace(result, profile_error=str(exc)), message
    entry = state.baseline.get(result.key)
    try:
        base = summary_top_ops(entry, f"baseline entry {result.key}") if entry else None
    except InputError as exc:  # the head's profile still stands; only the deltas are lost
        return replace(result, profile=run, profile_error=one_line(exc)), message
    run = replace(run, base=base)
    if message:
        message = f"{message}\n\n{text_section(run)}"
    return replace(result, profile=run), message


def _record_top_ops(state: TracemlState, result: GateResult, job: ProfileJob) -> GateResult:
    from traceml_ci.summary.profile import with_top_ops

    try:
        run = take_profile(state, result, job)
    except ProfileFailed as exc:
        return replace(result, profile_error=str(exc))
    assert result.summary is not None
    detail = f"{result.detail}; top ops recorded" if result.detail else "top ops recorded"
    return replace(result, summary=with_top_ops(result.summary, run.head), detail=detail,
                   profile=run)


def take_profile(state: TracemlState, result: GateResult, job: ProfileJob) -> ProfiledRun:
    """Run ``job`` once, profiled; its ProfiledRun (top ops, trace, seconds, bytes).
    ProfileFailed (one line) when the job failed or left no profile."""
    from traceml_ci.errors import InputError, one_line
    from traceml_ci.gate.render.ops import ProfiledRun
    from traceml_ci.summary.profile import (
        TOP_OPS_FILENAME,
        TRACE_FILENAME,
        profile_dir,
        read_top_ops,
    )

    out = _folder(state, result)
    where = profile_dir(out)
    for name in (TOP_OPS_FILENAME, TRACE_FILENAME):  # an earlier session's must not pass
        (where / name).unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        job(out, state.options.profile_steps)
    except _JOB_FAILURES as exc:
        text = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
        raise ProfileFailed(f"the profiled run failed: {one_line(text, 300)}") from None
    seconds = time.perf_counter() - t0
    try:
        top = read_top_ops(where / TOP_OPS_FILENAME)
    except InputError:
        raise ProfileFailed("the profiled run wrote no profile (too few steps after the "
                            "warmup, or the profiler failed: see its warning on stderr)") from None
    trace = where / TRACE_FILENAME
    size = trace.stat().st_size if trace.is_file() else None
    return ProfiledRun(result.key, top, trace=str(trace) if size else "", seconds=seconds,
                       trace_bytes=size)


def _folder(state: TracemlState, result: GateResult) -> Path:
    """``--traceml-profile-dir``/<key as a file name>, else a fresh folder beside the test's
    summaries."""
    opts = state.options
    if opts.profile_dir is None:
        return state.out_dir(result.nodeid) / "profiled"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", result.key).strip("._")[:80] or "test"
    digest = hashlib.sha1(result.key.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return opts.profile_dir / f"{name}-{digest}"  # two keys never share a folder
