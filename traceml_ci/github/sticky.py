"""One comment per job, edited in place: its hidden marker, trimming, and create-or-update."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from traceml_ci.github.client import CreateUncertain, GitHubClient, IssueComment

#: GitHub refuses a comment body longer than this many characters.
COMMENT_LIMIT = 65_536
TRIM_NOTE = (
    "\n\n> [!NOTE]\n> This report was cut to fit GitHub's 65,536-character comment limit; "
    "the whole report is in the job summary and the run's artifact."
)
#: After a create whose answer was lost, wait this long before looking for the comment it may
#: have made (GitHub's list can lag a write by a moment).
CREATE_RECHECK_DELAY_S = 2.0
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._/:@+=-]+")


class Outcome(str, Enum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    SKIPPED = "skipped"  # create=False and no earlier comment


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    comment: IssueComment | None


def marker_id(job_id: str) -> str:
    """``job_id`` with anything but letters, digits and ``._/:@+=-`` made ``_`` (never ``-->``)."""
    return _UNSAFE_ID.sub("_", job_id.strip()).strip("_")[:100] or "default"


def marker_for(job_id: str) -> str:
    """The hidden first line that identifies one job's comment, e.g. ``job=gpu/tests``."""
    return f"<!-- traceml-ci:report job={marker_id(job_id)} -->"


def gh_len(text: str) -> int:
    """Length as GitHub may count it: UTF-16 code units (never less than code points)."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def compose_body(report: str, marker: str, limit: int = COMMENT_LIMIT) -> str:
    """``marker`` as the first line, then the report, trimmed to fit."""
    lines = report.lstrip("\ufeff").splitlines()
    body = marker + "\n" + "\n".join(lines).strip("\n") + "\n"
    return body if gh_len(body) <= limit else _trim(body, limit)


def _trim(body: str, limit: int) -> str:
    """Cut at a line break so ``body``, the tags it leaves open and the note fit in ``limit``."""
    budget = limit - gh_len(TRIM_NOTE) - 1
    while True:
        kept = _cut(body, budget)
        closing = _closing(kept)
        if gh_len(kept) + gh_len(closing) <= budget or not kept:
            return kept + closing + TRIM_NOTE + "\n"
        budget -= gh_len(closing)


def _cut(text: str, budget: int) -> str:
    kept = text[: max(budget, 0)]
    while gh_len(kept) > budget:  # astral characters count twice
        kept = kept[: len(kept) - (gh_len(kept) - budget)]
    return kept[: kept.rindex("\n")] if "\n" in kept else kept


def _closing(kept: str) -> str:
    """What closes the code fence and ``<details>`` blocks left open by a cut."""
    closing = "\n```" if kept.count("```") % 2 else ""
    opened = len(re.findall(r"<details\b", kept)) - kept.count("</details>")
    return closing + "\n</details>" * max(opened, 0)


def starts_with_marker(body: str, marker: str) -> bool:
    """Whether ``body``'s first line is ``marker`` itself: not indented, quoted or further down."""
    return body.lstrip("\ufeff").split("\n", 1)[0].rstrip("\r") == marker


def find_comment(client: GitHubClient, repo: str, number: int, marker: str) -> IssueComment | None:
    """The oldest comment that starts with ``marker`` and that this tool wrote, following
    pagination.

    "Wrote" means its author is :meth:`GitHubClient.author_login`: the token's user, or for the
    workflow's token ``github-actions[bot]``. Anyone, another bot included, can copy the marker
    into a comment of theirs: it is neither edited nor trusted.
    """
    for comment in client.iter_issue_comments(repo, number):
        if starts_with_marker(comment.body, marker) and comment.written_by(client.author_login()):
            return comment
    return None


def upsert_comment(
    client: GitHubClient, repo: str, number: int, body: str, marker: str, *, create: bool = True
) -> Result:
    """Edit this job's comment on pull request ``number``, or create it if ``create``."""
    existing = find_comment(client, repo, number, marker)
    if existing is None:
        if not create:
            return Result(Outcome.SKIPPED, None)
        try:
            return Result(Outcome.CREATED, client.create_issue_comment(repo, number, body))
        except CreateUncertain:
            client.sleep(CREATE_RECHECK_DELAY_S)
            made = find_comment(client, repo, number, marker)  # did the failed create land?
            if made is not None:
                return Result(Outcome.CREATED, made)
            return Result(Outcome.CREATED, client.create_issue_comment(repo, number, body))
    if existing.body.replace("\r\n", "\n") == body:
        return Result(Outcome.UNCHANGED, existing)
    return Result(Outcome.UPDATED, client.update_issue_comment(repo, existing.id, body))
