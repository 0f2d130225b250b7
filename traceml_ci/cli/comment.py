"""``traceml-ci comment --body FILE``: create or update this job's one comment on a pull request."""

from __future__ import annotations

import argparse
import os
import re
import sys
from enum import Enum
from typing import Any

from traceml_ci.errors import InputError, UsageError

META_KIND = "traceml-ci/comment-meta"


class CommentMode(str, Enum):
    """What to do with this job's comment (``--mode``; the Action's gate step picks one)."""

    UPSERT = "upsert"  # edit it, or create it if there is none
    UPDATE = "update"  # only edit an earlier one: a fixed PR does not keep a stale table
    SKIP = "skip"  # do nothing


_MODES = tuple(m.value for m in CommentMode)

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
        choices=_MODES,
        help="upsert: create the comment if missing (default); update: only edit an existing "
        "one; skip: do nothing",
    )
    p.add_argument(
        "--meta",
        metavar="FILE",
        help="comment.json written by `traceml-ci action-gate`: defaults for --pr, --marker and "
        "--mode (in a workflow_run job the PR's head must then match the run's head_sha)",
    )
    p.add_argument(
        "--expect-head-sha",
        metavar="SHA",
        help="refuse unless the pull request's head is this commit (for workflow_run jobs that "
        "take the PR number from an artifact)",
    )
    p.set_defaults(func=run)


def _read_body(path: str) -> str:
    """The markdown, bounded: a regular file (a FIFO or device is refused, not waited on) or
    stdin, at most MAX_COMMENT_BODY_BYTES (GitHub keeps 65,536 characters of it; compose_body
    cuts a longer one with a note)."""
    from traceml_ci.fsutil import read_stream_text
    from traceml_ci.summary.io import MAX_COMMENT_BODY_BYTES, read_text

    if path == "-":
        return read_stream_text(sys.stdin.buffer, "--body - (stdin)", MAX_COMMENT_BODY_BYTES)
    return read_text(path, MAX_COMMENT_BODY_BYTES)


def _without_report_marker(report: str) -> str:
    """The report less the gate's generic first-line marker: the job's own marker replaces it."""
    from traceml_ci.gate.render.comparison import MARKER

    lines = report.lstrip("\ufeff").splitlines()
    if lines and lines[0].strip() == MARKER:
        lines = lines[1:]
    return "\n".join(lines)


def _read_meta(path: str) -> dict[str, Any]:
    """The gate step's metadata; it may come from an untrusted run's artifact, so check it."""
    from traceml_ci.summary.io import MAX_META_BYTES, read_json

    if os.path.islink(path):
        raise InputError(path, "is a symbolic link; refusing it")
    data = read_json(path, MAX_META_BYTES)  # bounded: no stream, no endless nesting
    if not isinstance(data, dict) or data.get("kind") != META_KIND:
        raise InputError(path, f"not a {META_KIND} file")
    pr, marker, mode = data.get("pr"), data.get("marker"), data.get("mode")
    if pr is not None and (not isinstance(pr, int) or isinstance(pr, bool) or pr <= 0):
        raise InputError(path, f"pr {pr!r} is not a pull request number")
    if not isinstance(marker, str) or mode not in _MODES:
        raise InputError(path, "needs a string marker and mode upsert, update or skip")
    return data


def _pull_request(args: argparse.Namespace, ctx: Any, meta: dict[str, Any]) -> tuple[str, int]:
    """The repository and pull request to comment on: the options', else the meta file's, else
    the workflow's."""
    repo = args.repo or ctx.repository
    if not repo:
        raise UsageError("no repository: pass --repo OWNER/NAME or set GITHUB_REPOSITORY")
    if not _REPO.match(repo):
        raise UsageError(f"--repo {repo!r} is not OWNER/NAME")
    if args.pr is not None and args.pr <= 0:
        raise UsageError(f"--pr {args.pr} is not a pull request number")
    number = args.pr if args.pr is not None else meta.get("pr") or ctx.pull_request_number()
    if number is None:
        raise UsageError(
            f"no pull request number: pass --pr N (event {ctx.event_name or 'unknown'} names none)"
        )
    return repo, number


def _expected_head(args: argparse.Namespace, ctx: Any, meta: dict[str, Any]) -> str | None:
    """The head commit the pull request must still have for the comment to be posted."""
    expect = args.expect_head_sha
    if not expect and ctx.event_name == "workflow_run" and args.pr is None and meta:
        # The PR number came from an artifact a pull request's code could write: trust it only
        # if that PR's head is the commit this workflow_run is about.
        expect = (ctx.event.get("workflow_run") or {}).get("head_sha")
    return expect


def run(args: argparse.Namespace) -> int:
    from traceml_ci.github.client import GitHubClient
    from traceml_ci.github.context import GitHubContext
    from traceml_ci.github.sticky import compose_body, marker_for, upsert_comment

    ctx = GitHubContext.from_environ()
    meta = _read_meta(args.meta) if args.meta else {}
    mode = CommentMode(args.mode or meta.get("mode") or CommentMode.UPSERT.value)
    if mode is CommentMode.SKIP:
        print("traceml-ci: comment skipped (mode skip)")
        return 0
    if not ctx.token:
        raise UsageError(
            "GITHUB_TOKEN is not set: pass a token with pull-requests: write in the environment"
        )
    repo, number = _pull_request(args, ctx, meta)
    if args.meta and os.path.islink(args.body):
        raise InputError(args.body, "is a symbolic link; refusing it")
    report = _read_body(args.body)
    if not report.strip():
        raise InputError(args.body, "the comment body is empty")
    marker = marker_for(args.marker or meta.get("marker") or ctx.job or "default")
    expect = _expected_head(args, ctx, meta)

    client = GitHubClient(token=ctx.token, api_url=ctx.api_url)
    if expect:
        head = client.pull_request_head_sha(repo, number)
        if head != expect:
            print(
                f"traceml-ci: not commenting: the head of {repo}#{number} is {head[:12]}, not "
                f"{str(expect)[:12]} (a newer push, or a PR number that does not match the run)"
            )
            return 0
    body = compose_body(_without_report_marker(client.scrub(report)), marker)
    result = upsert_comment(client, repo, number, body, marker,
                            create=mode is CommentMode.UPSERT)
    where = result.comment.html_url if result.comment and result.comment.html_url else ""
    ident = f" {result.comment.id}" if result.comment else ""
    print(f"traceml-ci: comment{ident} {result.outcome.value} on {repo}#{number} {where}".rstrip())
    return 0
