"""``traceml-ci action-gate``: the GitHub Action's gate step (pytest, verdict, summary, outputs).

Runs pytest with the traceml-ci plugin, which compares each traced test with the baseline once
and writes the session's one comparison (``comparison.json``) and its report (``report.md``).
The step's verdict is read from that comparison -- nothing is compared again here -- and the
job summary, the annotations, the step's outputs and the metadata a later ``traceml-ci comment
--meta`` needs are derived from it. The Action's decisions (does the job fail, is a comment
wanted, may this job post it) live here too; ``traceml_ci.github`` is transport only. It exits
0 whatever the verdict: the Action comments first and fails in its last step, on ``failed``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from traceml_ci.cli.comment import META_KIND, CommentMode
from traceml_ci.errors import UsageError
from traceml_ci.fsutil import write_output
from traceml_ci.gate.compare import Verdict
from traceml_ci.summary.keys import AB_INCONCLUSIVE_POLICIES as AB_INCONCLUSIVE

if TYPE_CHECKING:  # pragma: no cover
    from traceml_ci.github.context import GitHubContext

REPORT_NAME = "report.md"
SUMMARIES_NAME = "summaries.json"
COMPARISON_NAME = "comparison.json"
META_NAME = "comment.json"
#: --ab-base: the plugin's A/B results (--traceml-ab-json), whose verdict the step reads.
AB_NAME = "ab.json"
#: --profile-on-regression: the profiled re-runs' traces, one folder per key (in the artifact).
PROFILES_NAME = "profiles"


class NoVerdict(str, Enum):
    """Why the gate step has no verdict of the gate's to give (its ``verdict`` output then
    names this instead)."""

    NO_BASELINE = "no-baseline"  # first run: nothing to compare with yet
    ERROR = "error"  # no head summaries, or no comparison the plugin could write
    # --ab-base: base and head were too noisy to tell apart within the rounds allowed --
    # neither a pass nor a regression; the A/B's own word, as its JSON writes it
    INCONCLUSIVE = Verdict.INCONCLUSIVE.value


#: The step's ``verdict`` output: the gate's verdict, or why there is none.
Outcome = Verdict | NoVerdict


class CommentPolicy(str, Enum):
    """The Action's ``comment`` input."""

    ALWAYS = "always"
    ON_REGRESSION = "on-regression"
    NEVER = "never"


@dataclass(frozen=True)
class Failure:
    failed: bool
    reason: str


def decide_failure(outcome: Outcome, pytest_exit: int, fail_on_regression: bool) -> Failure:
    """Whether the job should fail, and the one line that says why."""
    if outcome is Verdict.REGRESSION and fail_on_regression:
        return Failure(True, "performance regression beyond tolerance (see the job summary)")
    if outcome is NoVerdict.INCONCLUSIVE and pytest_exit != 0:
        return Failure(True, f"pytest failed (exit {pytest_exit}); the A/B verdict is "
                       "inconclusive: base and head too noisy to tell apart within the rounds "
                       "allowed -- re-run (see the job summary)")
    if pytest_exit == 5:
        return Failure(True, "pytest collected no tests: check pytest-args")
    if pytest_exit != 0:
        return Failure(True, f"pytest failed (exit {pytest_exit})")
    if outcome is NoVerdict.ERROR:
        return Failure(True, "the gate could not judge this run (see the log)")
    return Failure(False, "")


def intended_comment(policy: CommentPolicy, outcome: Outcome) -> CommentMode:
    """The comment this outcome calls for under ``policy``, wherever the job runs."""
    if policy is CommentPolicy.NEVER:
        return CommentMode.SKIP
    if policy is CommentPolicy.ALWAYS or outcome in (Verdict.REGRESSION, NoVerdict.INCONCLUSIVE):
        return CommentMode.UPSERT
    # Only refresh an earlier comment, so a fixed PR does not keep showing a stale table.
    return CommentMode.UPDATE


def comment_here(intended: CommentMode, ctx: GitHubContext) -> tuple[CommentMode, str]:
    """Whether this job can post the comment itself, and a note when it cannot."""
    if intended is CommentMode.SKIP:
        return CommentMode.SKIP, ""
    if not ctx.is_pull_request or ctx.pull_request_number() is None:
        return CommentMode.SKIP, ""
    if ctx.event_name == "pull_request" and ctx.is_fork_pull_request():
        return CommentMode.SKIP, (
            "pull request from a fork: its token is read-only, so this job does not comment; "
            "a workflow_run job can post the report from this run's artifact "
            "(github-action/examples/fork-safe-comment.yml)"
        )
    return intended, ""


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
        description="Run pytest with the traceml-ci plugin, which compares each traced test with "
        "BASELINE once and writes the session's comparison; take the verdict from it, append "
        "its report to $GITHUB_STEP_SUMMARY and write the step outputs (verdict, report-path, "
        "comparison-path, summary-path, failed, comment-mode, ...) to $GITHUB_OUTPUT. "
        "Exits 0 whatever the verdict; exit 2 on bad arguments.",
    )
    p.add_argument("--baseline", metavar="PATH", default="", help="the committed baseline set")
    p.add_argument("--tolerances", metavar="FILE", default="", help="tolerance rules (TOML)")
    p.add_argument(
        "--ab-base", metavar="REF", default="",
        help="judge the traced tests A/B against REF instead of a baseline (pytest "
        "--traceml-ab): base and head run interleaved on this runner",
    )
    p.add_argument(
        "--ab-inconclusive", choices=AB_INCONCLUSIVE, default=AB_INCONCLUSIVE[0],
        help="with --ab-base: what a test too noisy to decide does (pytest "
        "--traceml-ab-inconclusive): pass (default), warn or fail",
    )
    p.add_argument(
        "--pytest-args", metavar="ARGS", default="", help="pytest arguments (one string)"
    )
    p.add_argument(
        "--comment", choices=[c.value for c in CommentPolicy],
        default=CommentPolicy.ON_REGRESSION.value,
    )
    p.add_argument("--fail-on-regression", type=_bool, default=True, metavar="BOOL")
    p.add_argument(
        "--profile-on-regression", type=_bool, default=False, metavar="BOOL",
        help="re-run a regressed test under torch.profiler; its trace goes to the artifact",
    )
    p.add_argument("--comment-id", metavar="ID", default="", help="marker id (default $GITHUB_JOB)")
    p.add_argument("--out", metavar="DIR", default="", help="where the report and summaries go")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from traceml_ci.github.context import GitHubContext
    from traceml_ci.github.runner import annotation, write_outputs
    from traceml_ci.github.sticky import marker_id

    ctx = GitHubContext.from_environ()
    ctx.event  # noqa: B018 - an unreadable event file is a usage error before pytest, not after
    try:
        pytest_args = shlex.split(args.pytest_args)
    except ValueError as exc:
        raise UsageError(f"--pytest-args: {exc}") from None
    if args.ab_base and args.baseline:
        raise UsageError("--ab-base and --baseline: give one (A/B judges each test against its "
                         "base run beside it, not against a stored baseline)")
    if args.tolerances and not Path(args.tolerances).is_file():
        raise UsageError(f"--tolerances {args.tolerances}: no such file")
    job_id = marker_id(args.comment_id or ctx.job or "default")
    files = _Files(_out_dir(args.out, job_id, ctx.runner_temp))
    baseline = Path(args.baseline) if args.baseline else None

    pytest_exit = _run_pytest(pytest_args, files, baseline, args)
    verdict = _judge(files, baseline, pytest_exit, ab=bool(args.ab_base))
    failure = decide_failure(verdict, pytest_exit, args.fail_on_regression)
    intended = intended_comment(CommentPolicy(args.comment), verdict)
    mode, note = comment_here(intended, ctx)
    pr = ctx.pull_request_number()
    _write_meta(files.meta, pr, job_id, intended.value if pr else "skip", ctx, verdict)

    for line in _annotations(verdict, failure.reason, baseline, args.fail_on_regression, note,
                             failed=failure.failed):
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
        self.profiles = out / PROFILES_NAME
        self.ab = out / AB_NAME


def _run_pytest(
    pytest_args: list[str], files: _Files, baseline: Path | None, args: argparse.Namespace
) -> int:
    cmd = [sys.executable, "-m", "pytest", *pytest_args]
    cmd += [f"--traceml-report={files.report}", f"--traceml-save={files.summaries}",
            f"--traceml-comparison={files.comparison}"]
    if baseline is not None:
        cmd.append(f"--traceml-baseline={baseline}")
    if args.ab_base:
        cmd += [f"--traceml-ab={args.ab_base}", f"--traceml-ab-json={files.ab}",
                f"--traceml-ab-inconclusive={args.ab_inconclusive}"]
    if (baseline is not None or args.ab_base) and not args.fail_on_regression:
        cmd.append("--traceml-report-only")  # compared and reported; no test fails on it
    if args.tolerances:
        cmd.append(f"--traceml-tolerances={args.tolerances}")
    if args.profile_on_regression:
        cmd += ["--traceml-profile-on-regression", f"--traceml-profile-dir={files.profiles}"]
    print(f"traceml-ci: {shlex.join(cmd)}", flush=True)
    return subprocess.call(cmd)


def _judge(files: _Files, baseline: Path | None, pytest_exit: int, ab: bool = False) -> Outcome:
    """The step's verdict: the plugin's session comparison's (with ``ab``: its A/B results'),
    read back, never recomputed. Leaves a report in ``files.report`` whatever happened."""
    outcome: Outcome
    if not files.summaries.is_file():
        outcome = NoVerdict.ERROR
        print(f"traceml-ci: pytest wrote no head summaries ({files.summaries})", file=sys.stderr)
    elif ab:
        outcome = _ab_verdict(files.ab)
    elif baseline is None or not baseline.is_file():
        outcome = NoVerdict.NO_BASELINE
        files.report.unlink(missing_ok=True)  # nothing was compared: say so, not "incomparable"
    else:
        outcome = _comparison_verdict(files.comparison)
    if not files.report.is_file():
        write_output(files.report, _fallback_report(outcome, baseline, pytest_exit))
    return outcome


def _comparison_verdict(path: Path) -> Outcome:
    """The verdict of the plugin's ``--traceml-comparison`` file; ERROR when it has none."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return Verdict(doc["verdict"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = "missing" if isinstance(exc, FileNotFoundError) else "unreadable"
        print(f"traceml-ci: the plugin's comparison {path} is {why}", file=sys.stderr)
        return NoVerdict.ERROR


def _ab_verdict(path: Path) -> Outcome:
    """The verdict of the plugin's ``--traceml-ab-json`` file: pass or regression, inconclusive,
    NO_BASELINE when no test had a base to pair with; ERROR when the file has none."""
    try:
        verdict = json.loads(path.read_text(encoding="utf-8"))["verdict"]
        if verdict is None:
            return NoVerdict.NO_BASELINE
        if verdict == Verdict.INCONCLUSIVE.value:
            return NoVerdict.INCONCLUSIVE
        return Verdict(verdict)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = "missing" if isinstance(exc, FileNotFoundError) else "unreadable"
        print(f"traceml-ci: the plugin's A/B results {path} are {why}", file=sys.stderr)
        return NoVerdict.ERROR


def _write_meta(
    path: Path, pr: int | None, job_id: str, mode: str, ctx: GitHubContext, verdict: Outcome
) -> None:
    """comment.json: what `traceml-ci comment --meta` needs, here or in a workflow_run job."""
    meta = {"kind": META_KIND, "pr": pr, "marker": job_id, "mode": mode,
            "head_sha": ctx.pull_request_head_sha(), "verdict": verdict.value}  # fmt: skip
    write_output(path, json.dumps(meta, indent=2) + "\n")


def _append_summary(
    path: str, report: Path, job_id: str, verdict: Outcome, pytest_exit: int, reason: str
) -> None:
    from traceml_ci.gate.render.comparison import MARKER
    from traceml_ci.github.runner import append_step_summary

    body = report.read_text(encoding="utf-8")
    if body.startswith(MARKER):
        body = body[len(MARKER) :].lstrip("\n")
    footer = f"<sub>traceml-ci · job `{job_id}` · verdict **{verdict.value}** · pytest exit "
    footer += f"{pytest_exit}" + (f" · {_md_code(reason)}" if reason else "") + "</sub>"
    append_step_summary(path, f"{body.rstrip()}\n\n{footer}\n")


def _out_dir(given: str, job_id: str, runner_temp: str | None) -> Path:
    if given:
        out = Path(given)
    elif runner_temp:
        out = Path(runner_temp) / "traceml-ci" / job_id.replace("/", "-")
    else:
        out = Path("traceml-ci-out")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in (REPORT_NAME, SUMMARIES_NAME, COMPARISON_NAME, META_NAME, AB_NAME):
        (out / name).unlink(missing_ok=True)  # a stale file must not pass for this run's
    shutil.rmtree(out / PROFILES_NAME, ignore_errors=True)
    return out


def _md_code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _no_baseline_note(baseline: Path | None) -> str:
    if baseline is None:
        return "No baseline given: set the Action's `baseline` input to gate this job."
    return (
        f"No baseline at {_md_code(str(baseline))} yet: create it with "
        f"`pytest --traceml-baseline={baseline} --traceml-update-baseline` and commit it."
    )


def _fallback_report(verdict: Outcome, baseline: Path | None, pytest_exit: int) -> str:
    from traceml_ci.gate.render.comparison import MARKER

    if verdict is NoVerdict.NO_BASELINE:
        text = f"**traceml-ci: no baseline yet.** {_no_baseline_note(baseline)}"
    elif verdict is NoVerdict.ERROR:
        text = (
            f"**traceml-ci: no verdict.** pytest exited {pytest_exit} and the head summaries "
            "could not be judged; see the job log."
        )
    else:
        text = f"**traceml-ci: {verdict.value}.**"
    return f"{MARKER}\n{text}\n"


def _annotations(
    verdict: Outcome, reason: str, baseline: Path | None, fail: bool, note: str,
    failed: bool = False,
) -> Iterator[tuple[str, str, str]]:
    title = "traceml-ci"
    if verdict is Verdict.REGRESSION:
        level = "error" if fail else "warning"
        yield level, "performance regression beyond tolerance: see the job summary", title
    elif verdict is Verdict.INCOMPARABLE:
        yield "warning", "base and head are not comparable (see the job summary)", title
    elif verdict is NoVerdict.INCONCLUSIVE:  # no evidence of a regression: a note, unless it fails
        yield ("warning" if failed else "notice"), (
            "A/B inconclusive: too noisy to tell base and head apart; the estimates are in the "
            "job summary"), title
    elif verdict is NoVerdict.NO_BASELINE:
        yield "notice", _no_baseline_note(baseline).replace("`", ""), title
    if reason and verdict is not Verdict.REGRESSION:
        yield "error", reason, title
    if note:
        yield "notice", note, title
