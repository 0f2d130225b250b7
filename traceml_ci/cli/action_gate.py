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
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from traceml_ci.cli.comment import META_KIND
from traceml_ci.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
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
        Verdict,
        comment_here,
        decide_failure,
        intended_comment,
    )
    from traceml_ci.github.runner import annotation, append_step_summary, write_outputs
    from traceml_ci.github.sticky import REPORT_MARKER, marker_id

    ctx = GitHubContext.from_environ()
    try:
        pytest_args = shlex.split(args.pytest_args)
    except ValueError as exc:
        raise UsageError(f"--pytest-args: {exc}") from None
    if args.tolerances and not Path(args.tolerances).is_file():
        raise UsageError(f"--tolerances {args.tolerances}: no such file")
    job_id = marker_id(args.comment_id or ctx.job or "default")
    out = _out_dir(args.out, job_id)
    report, summaries = out / REPORT_NAME, out / SUMMARIES_NAME
    comparison, meta = out / COMPARISON_NAME, out / META_NAME
    baseline = Path(args.baseline) if args.baseline else None
    has_baseline = baseline is not None and baseline.is_file()

    cmd = [sys.executable, "-m", "pytest", *pytest_args]
    cmd += [f"--traceml-report={report}", f"--traceml-save={summaries}"]
    if baseline is not None and args.fail_on_regression:
        # Without it, a regression cannot fail a test: the verdict comes from the diff below.
        cmd.append(f"--traceml-baseline={baseline}")
    if args.tolerances:
        cmd.append(f"--traceml-tolerances={args.tolerances}")
    print(f"traceml-ci: {shlex.join(cmd)}", flush=True)
    pytest_exit = subprocess.call(cmd)

    if not summaries.is_file():
        verdict = Verdict.ERROR
        print(f"traceml-ci: pytest wrote no head summaries ({summaries})", file=sys.stderr)
    elif not has_baseline:
        verdict = Verdict.NO_BASELINE
    else:
        verdict = _diff_verdict(baseline, summaries, args.tolerances, comparison)
        if not args.fail_on_regression or not report.is_file():
            _diff(baseline, summaries, args.tolerances, report, "markdown")
    if not report.is_file():
        report.write_text(_fallback_report(verdict, baseline, pytest_exit), encoding="utf-8")
    elif verdict is Verdict.NO_BASELINE:
        text = report.read_text(encoding="utf-8")
        if "--traceml-update-baseline" not in text:
            report.write_text(text.rstrip("\n") + "\n\n" + _no_baseline_note(baseline) + "\n")

    failure = decide_failure(verdict, pytest_exit, args.fail_on_regression)
    intended = intended_comment(CommentPolicy(args.comment), verdict)
    mode, note = comment_here(intended, ctx)
    pr = ctx.pull_request_number() if ctx.is_pull_request else None
    meta.write_text(
        json.dumps(
            {
                "kind": META_KIND,
                "pr": pr,
                "marker": job_id,
                "mode": intended.value if pr else "skip",
                "head_sha": ctx.pull_request_head_sha(),
                "verdict": verdict.value,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )

    for line in _annotations(verdict, failure.reason, baseline, args.fail_on_regression, note):
        print(annotation(*line), flush=True)
    if ctx.step_summary_path:
        body = report.read_text(encoding="utf-8")
        if body.startswith(REPORT_MARKER):
            body = body[len(REPORT_MARKER) :].lstrip("\n")
        footer = (
            f"<sub>traceml-ci · job `{job_id}` · verdict **{verdict.value}** · "
            f"pytest exit {pytest_exit}"
            + (f" · {_md_code(failure.reason)}" if failure.failed else "")
            + "</sub>"
        )
        append_step_summary(ctx.step_summary_path, f"{body.rstrip()}\n\n{footer}\n")
    outputs = {
        "verdict": verdict.value,
        "failed": "true" if failure.failed else "false",
        "reason": failure.reason,
        "pytest-exit-code": str(pytest_exit),
        "report-path": str(report),
        "summary-path": str(summaries),
        "comparison-path": str(comparison) if comparison.is_file() else "",
        "meta-path": str(meta),
        "comment-mode": mode.value,
        "artifact-dir": str(out),
        "artifact-name": f"traceml-ci-{job_id.replace('/', '-').replace(':', '-')}",
    }
    if ctx.output_path:
        write_outputs(ctx.output_path, outputs)
    print(f"traceml-ci: verdict {verdict.value}; report {report}", flush=True)
    return 0


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
