"""``traceml-ci comment --body FILE``: create or update this job's one comment on a pull request."""

from __future__ import annotations

import argparse
import re
import sys

from traceml_ci.errors import InputError, UsageError

_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "comment",
        help="create or update this job's comment on a pull request",
        description="Post FILE (markdown, e.g. from `traceml-ci diff --format markdown`) as a "
        "comment on a pull request, or edit the comment an earlier run of the same job left "
        "(found by a hidden marker that includes --marker). Reads GITHUB_TOKEN, GITHUB_API_URL, "
        "GITHUB_REPOSITORY and GITHUB_EVENT_PATH. Exit codes: 0 done, 2 usage error, "
        "5 GitHub API failure.",
    )
    p.add_argument(
        "--body", required=True, metavar="FILE", help="the markdown to post; - for stdin"
    )
    p.add_argument("--repo", metavar="OWNER/NAME", help="repository (default $GITHUB_REPOSITORY)")
    p.add_argument(
        "--pr", type=int, metavar="N", help="pull request number (default: from the event payload)"
    )
    p.add_argument(
        "--marker",
        metavar="ID",
        help="which job's comment this is (default $GITHUB_JOB); one comment per marker",
    )
    p.add_argument(
        "--mode",
        choices=("upsert", "update"),
        default="upsert",
        help="upsert: create the comment if missing (default); update: only edit an existing one",
    )
    p.add_argument(
        "--expect-head-sha",
        metavar="SHA",
        help="refuse unless the pull request's head is this commit (for workflow_run jobs that "
        "take the PR number from an artifact)",
    )
    p.set_defaults(func=run)


def _read_body(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise InputError(path, f"cannot read the comment body: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(path, "the comment body is not UTF-8 text") from None


def run(args: argparse.Namespace) -> int:
    from traceml_ci.errors import ApiError
    from traceml_ci.github.client import GitHubClient
    from traceml_ci.github.context import GitHubContext
    from traceml_ci.github.sticky import Mode, compose_body, marker_for, upsert_comment

    ctx = GitHubContext.from_environ()
    if not ctx.token:
        raise UsageError(
            "GITHUB_TOKEN is not set: pass a token with pull-requests: write in the environment"
        )
    repo = args.repo or ctx.repository
    if not repo:
        raise UsageError("no repository: pass --repo OWNER/NAME or set GITHUB_REPOSITORY")
    if not _REPO.match(repo):
        raise UsageError(f"--repo {repo!r} is not OWNER/NAME")
    if args.pr is not None and args.pr <= 0:
        raise UsageError(f"--pr {args.pr} is not a pull request number")
    number = args.pr if args.pr is not None else ctx.pull_request_number()
    if number is None:
        raise UsageError(
            f"no pull request number: pass --pr N (event {ctx.event_name or 'unknown'} names none)"
        )
    report = _read_body(args.body)
    if not report.strip():
        raise InputError(args.body, "the comment body is empty")
    marker = marker_for(args.marker or ctx.job or "default")

    client = GitHubClient(token=ctx.token, api_url=ctx.api_url)
    if args.expect_head_sha:
        head = client.pull_request_head_sha(repo, number)
        if head != args.expect_head_sha:
            raise ApiError(
                f"{repo}#{number}: head is {head[:12]}, not {args.expect_head_sha[:12]}; "
                "not commenting (a newer push, or a PR number that does not match the run)"
            )
    body = compose_body(report, marker)
    result = upsert_comment(client, repo, number, body, marker, Mode(args.mode))
    where = result.comment.html_url if result.comment and result.comment.html_url else ""
    ident = f" {result.comment.id}" if result.comment else ""
    print(f"traceml-ci: comment{ident} {result.outcome.value} on {repo}#{number} {where}".rstrip())
    return 0
