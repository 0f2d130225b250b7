"""What the Action's gate step decides: the verdict, whether the job fails, whether to comment.

Pure functions over plain values, so every branch is testable without GitHub or pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from traceml_ci.github.context import GitHubContext


class Verdict(str, Enum):
    """The gate's verdicts (as ``traceml-ci diff`` names them) plus the Action's own two."""

    PASS = "pass"
    WARN = "warn"
    REGRESSION = "regression"
    INCOMPARABLE = "incomparable"
    NO_BASELINE = "no-baseline"  # first run: nothing to compare with yet
    ERROR = "error"  # no head summaries, or a baseline the gate could not read


class CommentPolicy(str, Enum):
    ALWAYS = "always"
    ON_REGRESSION = "on-regression"
    NEVER = "never"


class CommentMode(str, Enum):
    """What ``traceml-ci comment --mode`` is asked to do."""

    UPSERT = "upsert"
    UPDATE = "update"  # only refresh an earlier comment, so a fixed PR does not show a stale table
    SKIP = "skip"


#: ``traceml-ci diff`` exit codes (see ``traceml-ci diff --help``).
DIFF_EXIT_VERDICTS = {0: Verdict.PASS, 1: Verdict.REGRESSION, 3: Verdict.INCOMPARABLE}


def verdict_from_diff(exit_code: int, report: dict[str, Any] | None) -> Verdict:
    """The verdict of ``traceml-ci diff --format json``: from its JSON if readable, else its code.

    Exit 2 (bad input) or an unknown code is an error: the gate could not judge.
    """
    if exit_code not in DIFF_EXIT_VERDICTS:
        return Verdict.ERROR
    value = (report or {}).get("verdict")
    try:
        verdict = Verdict(value)
    except ValueError:
        return DIFF_EXIT_VERDICTS[exit_code]
    return verdict if verdict not in (Verdict.NO_BASELINE, Verdict.ERROR) else Verdict.ERROR


@dataclass(frozen=True)
class Failure:
    failed: bool
    reason: str


def decide_failure(verdict: Verdict, pytest_exit: int, fail_on_regression: bool) -> Failure:
    """Whether the job should fail, and the one line that says why."""
    if verdict is Verdict.REGRESSION and fail_on_regression:
        return Failure(True, "performance regression beyond tolerance (see the job summary)")
    if pytest_exit == 5:
        return Failure(True, "pytest collected no tests: check pytest-args")
    if pytest_exit != 0:
        return Failure(True, f"pytest failed (exit {pytest_exit})")
    if verdict is Verdict.ERROR:
        return Failure(True, "the gate could not judge this run (see the log)")
    return Failure(False, "")


def intended_comment(policy: CommentPolicy, verdict: Verdict) -> CommentMode:
    """The comment this verdict calls for under ``policy``, wherever the job runs."""
    if policy is CommentPolicy.NEVER:
        return CommentMode.SKIP
    if policy is CommentPolicy.ALWAYS or verdict is Verdict.REGRESSION:
        return CommentMode.UPSERT
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
