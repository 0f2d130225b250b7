"""``traceml-ci action-gate``: the GitHub Action's gate step (pytest, verdict, summary, outputs).

Runs pytest with the traceml-ci plugin, judges the head summaries against the baseline with
``traceml-ci diff``, appends the report to the job summary, writes the step's outputs and the
metadata a later ``traceml-ci comment --meta`` needs. It exits 0 whatever the verdict: the
Action comments first and fails in its last step, on the ``failed`` output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from traceml_ci.cli.comment import META_KIND
from traceml_ci.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from traceml_ci.github.context import GitHubContext
    from traceml_ci.github.gate_step import Verdict

REPORT_NAME = "report.md"
SUMMARIES_NAME = "summaries.json"
COMPARISON_NAME = "comparison.json"
META_NAME = "comment.json"


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "action-gate",
        help="the GitHub Action's gate step: pytest, verdict, job summary, outputs",
        description="Run pytest with the traceml-ci plugin, judge the head summaries against "
        "BASELINE, append the report to $GITHUB_STEP_SUMMARY and write the step outputs "
        "(verdict, report-path, summary-path, failed, comment-mode, ...) to $GITHUB_OUTPUT. "
        "Exits 0 whatever the verdict; exit 2 on bad arguments.",
    )
    p.add_argument("--baseline", metavar="PATH", default="", help="the committed baseline set")
    p.add_argument("--tolerances", metavar="FILE", default="", help="tolerance rules (TOML)")
    p.add_argument(
        "--pytest-args", metavar="ARGS", default="", help="pytest arguments (one string)"
    )
    p.add_argument(
        "--comment", choices=("always", "on-regression", "never"), default="on-regression"
    )
    p.add_argument("--fail-on-regression", type=_bool, default=True, metavar="BOOL")
    p.add_argument("--comment-id", metavar="ID", default="", help="marker id (default $GITHUB_JOB)")
    p.add_argument("--out", metavar="DIR", default="", help="where the report and summaries go")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from traceml_ci.github.context import GitHubContext
    from traceml_ci.github.gate_step import (
        CommentPolicy,
        comment_here,
        decide_failure,
        intended_comment,
    )
    from traceml_ci.github.runner import annotation, write_outputs
    from traceml_ci.github.sticky import marker_id

    ctx = GitHubContext.from_environ()
    ctx.event  # noqa: B018 - an unreadable event file is a usage error before pytest, not after
    try:
        pytest_args = shlex.split(args.pytest_args)
    except ValueError as exc:
        raise UsageError(f"--pytest-args: {exc}") from None
    if args.tolerances and not Path(args.tolerances).is_file():
        raise UsageError(f"--tolerances {args.tolerances}: no such file")
    job_id = marker_id(args.comment_id or ctx.job or "default")
    files = _Files(_out_dir(args.out, job_id))
    baseline = Path(args.baseline) if args.baseline else None

    pytest_exit = _run_pytest(pytest_args, files, baseline, args)
    verdict = _judge(files, baseline, args.tolerances, args.fail_on_regression, pytest_exit)
    failure = decide_failure(verdict, pytest_exit, args.fail_on_regression)
    intended = intended_comment(CommentPolicy(args.comment), verdict)
    mode, note = comment_here(intended, ctx)
    pr = ctx.pull_request_number()
    _write_meta(files.meta, pr, job_id, intended.value if pr else "skip", ctx, verdict)

    for line in _annotations(verdict, failure.reason, baseline, args.fail_on_regression, note):
        print(annotation(*line), flush=True)
    if ctx.step_summary_path:
        _append_summary(ctx.step_summary_path, files.report, job_id, verdict, pytest_exit,
                        failure.reason)  # fmt: skip
    if ctx.output_path:
        write_outputs(ctx.output_path, {
            "verdict": verdict.value,
            "failed": "true" if failure.failed else "false",
            "reason": failure.reason,
            "pytest-exit-code": str(pytest_exit),
            "report-path": str(files.report),
            "summary-path": str(files.summaries),
            "comparison-path": str(files.comparison) if files.comparison.is_file() else "",
            "meta-path": str(files.meta),
            "comment-mode": mode.value,
            "artifact-dir": str(files.out),
            "artifact-name": "traceml-ci-" + re.sub(r"[/:]", "-", job_id),
        })  # fmt: skip
    print(f"traceml-ci: verdict {verdict.value}; report {files.report}", flush=True)
    return 0


class _Files:
    """What the gate step writes, all in one folder (the artifact)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.report = out / REPORT_NAME
        self.summaries = out / SUMMARIES_NAME
        self.comparison = out / COMPARISON_NAME
        self.meta = out / META_NAME


def _run_pytest(
    pytest_args: list[str], files: _Files, baseline: Path | None, args: argparse.Namespace
) -> int:
    cmd = [sys.executable, "-m", "pytest", *pytest_args]
    cmd += [f"--traceml-report={files.report}", f"--traceml-save={files.summaries}"]
    if baseline is not None and args.fail_on_regression:
        # Without it a regression cannot fail a test: the verdict comes from `diff` alone.
        cmd.append(f"--traceml-baseline={baseline}")
    if args.tolerances:
        cmd.append(f"--traceml-tolerances={args.tolerances}")
    print(f"traceml-ci: {shlex.join(cmd)}", flush=True)
    return subprocess.call(cmd)


def _judge(
    files: _Files, baseline: Path | None, tolerances: str, fail_on_regression: bool,
    pytest_exit: int,
) -> Verdict:  # fmt: skip
    """The verdict; leaves a report in ``files.report`` whatever happened."""
    from traceml_ci.github.gate_step import Verdict

    if not files.summaries.is_file():
        verdict = Verdict.ERROR
        print(f"traceml-ci: pytest wrote no head summaries ({files.summaries})", file=sys.stderr)
    elif baseline is None or not baseline.is_file():
        verdict = Verdict.NO_BASELINE
    else:
        verdict = _diff_verdict(baseline, files.summaries, tolerances, files.comparison)
        if not fail_on_regression or not files.report.is_file():
            _diff(baseline, files.summaries, tolerances, files.report, "markdown")
    if not files.report.is_file():
        text = _fallback_report(verdict, baseline, pytest_exit)
        files.report.write_text(text, encoding="utf-8")
    elif verdict is Verdict.NO_BASELINE:
        text = files.report.read_text(encoding="utf-8")
        if "--traceml-update-baseline" not in text:
            text = text.rstrip("\n") + "\n\n" + _no_baseline_note(baseline) + "\n"
            files.report.write_text(text, encoding="utf-8")
    return verdict


def _write_meta(
    path: Path, pr: int | None, job_id: str, mode: str, ctx: GitHubContext, verdict: Verdict
) -> None:
    """comment.json: what `traceml-ci comment --meta` needs, here or in a workflow_run job."""
    meta = {"kind": META_KIND, "pr": pr, "marker": job_id, "mode": mode,
            "head_sha": ctx.pull_request_head_sha(), "verdict": verdict.value}  # fmt: skip
    path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _append_summary(
    path: str, report: Path, job_id: str, verdict: Verdict, pytest_exit: int, reason: str
) -> None:
    from traceml_ci.github.runner import append_step_summary
    from traceml_ci.github.sticky import REPORT_MARKER

    body = report.read_text(encoding="utf-8")
    if body.startswith(REPORT_MARKER):
        body = body[len(REPORT_MARKER) :].lstrip("\n")
    footer = f"<sub>traceml-ci · job `{job_id}` · verdict **{verdict.value}** · pytest exit "
    footer += f"{pytest_exit}" + (f" · {_md_code(reason)}" if reason else "") + "</sub>"
    append_step_summary(path, f"{body.rstrip()}\n\n{footer}\n")


def _out_dir(given: str, job_id: str) -> Path:
    if given:
        out = Path(given)
    elif os.environ.get("RUNNER_TEMP"):
        out = Path(os.environ["RUNNER_TEMP"]) / "traceml-ci" / job_id.replace("/", "-")
    else:
        out = Path("traceml-ci-out")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in (REPORT_NAME, SUMMARIES_NAME, COMPARISON_NAME, META_NAME):
        (out / name).unlink(missing_ok=True)  # a stale file must not pass for this run's
    return out


def _diff(baseline: Path, head: Path, tolerances: str, output: Path, fmt: str) -> int:
    """Run ``traceml-ci diff`` in-process (its contract is the CLI's); its exit code."""
    from traceml_ci.cli.main import main

    argv = ["diff", str(baseline), str(head), "--format", fmt, "--output", str(output)]
    if tolerances:
        argv += ["--tolerances", tolerances]
    return main(argv)


def _diff_verdict(baseline: Path, head: Path, tolerances: str, output: Path) -> Verdict:
    from traceml_ci.github.gate_step import verdict_from_diff

    code = _diff(baseline, head, tolerances, output, "json")
    try:
        doc = json.loads(output.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = None
    return verdict_from_diff(code, doc if isinstance(doc, dict) else None)


def _md_code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _no_baseline_note(baseline: Path | None) -> str:
    if baseline is None:
        return "No baseline given: set the Action's `baseline` input to gate this job."
    return (
        f"No baseline at {_md_code(str(baseline))} yet: create it with "
        f"`pytest --traceml-baseline={baseline} --traceml-update-baseline` and commit it."
    )


def _fallback_report(verdict: Verdict, baseline: Path | None, pytest_exit: int) -> str:
    from traceml_ci.github.gate_step import Verdict
    from traceml_ci.github.sticky import REPORT_MARKER

    if verdict is Verdict.NO_BASELINE:
        text = f"**traceml-ci: no baseline yet.** {_no_baseline_note(baseline)}"
    elif verdict is Verdict.ERROR:
        text = (
            f"**traceml-ci: no verdict.** pytest exited {pytest_exit} and the head summaries "
            "could not be judged; see the job log."
        )
    else:
        text = f"**traceml-ci: {verdict.value}.**"
    return f"{REPORT_MARKER}\n{text}\n"


def _annotations(
    verdict: Verdict, reason: str, baseline: Path | None, fail: bool, note: str
) -> Iterator[tuple[str, str, str]]:
    from traceml_ci.github.gate_step import Verdict

    title = "traceml-ci"
    if verdict is Verdict.REGRESSION:
        level = "error" if fail else "warning"
        yield level, "performance regression beyond tolerance: see the job summary", title
    elif verdict is Verdict.INCOMPARABLE:
        yield "warning", "base and head are not comparable (see the job summary)", title
    elif verdict is Verdict.NO_BASELINE:
        yield "notice", _no_baseline_note(baseline).replace("`", ""), title
    if reason and verdict is not Verdict.REGRESSION:
        yield "error", reason, title
    if note:
        yield "notice", note, title
