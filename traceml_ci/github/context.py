"""Where a workflow step runs: the GITHUB_* environment (and ``RUNNER_TEMP``) and the event
payload, read once, typed; the front doors' one reader of GitHub's variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.github.client import DEFAULT_API_URL

#: Events whose payload carries the pull request under ``pull_request``.
PULL_REQUEST_EVENTS = frozenset(
    {"pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment"}
)


@dataclass(frozen=True)
class GitHubContext:
    """The parts of a GitHub Actions environment traceml-ci uses. ``token`` never shows in repr."""

    api_url: str = DEFAULT_API_URL
    token: str | None = field(default=None, repr=False)
    repository: str | None = None
    event_name: str | None = None
    event_path: str | None = None
    job: str | None = None
    workflow: str | None = None
    run_id: str | None = None
    server_url: str = "https://github.com"
    output_path: str | None = None
    step_summary_path: str | None = None
    #: The runner's scratch folder (``RUNNER_TEMP``), emptied after each job: the Action's files.
    runner_temp: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> GitHubContext:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            return env.get(name) or None

        return cls(
            api_url=get("GITHUB_API_URL") or DEFAULT_API_URL,
            token=get("GITHUB_TOKEN"),
            repository=get("GITHUB_REPOSITORY"),
            event_name=get("GITHUB_EVENT_NAME"),
            event_path=get("GITHUB_EVENT_PATH"),
            job=get("GITHUB_JOB"),
            workflow=get("GITHUB_WORKFLOW"),
            run_id=get("GITHUB_RUN_ID"),
            server_url=get("GITHUB_SERVER_URL") or "https://github.com",
            output_path=get("GITHUB_OUTPUT"),
            step_summary_path=get("GITHUB_STEP_SUMMARY"),
            runner_temp=get("RUNNER_TEMP"),
        )

    @cached_property
    def event(self) -> dict[str, Any]:
        """The event payload; ``{}`` outside Actions. Raises InputError if the file is unusable."""
        if not self.event_path:
            return {}
        from traceml_ci.summary.io import MAX_EVENT_BYTES, read_json

        try:  # bounded: a regular file only, no endless nesting; a PR body's length is its own
            data = read_json(self.event_path, MAX_EVENT_BYTES, max_string_chars=None)
        except InputError as exc:
            raise InputError(f"{self.event_path} (GITHUB_EVENT_PATH)", exc.problem) from None
        if not isinstance(data, dict):
            raise InputError(self.event_path, "the event file is not a JSON object")
        return data

    @property
    def is_pull_request(self) -> bool:
        return self.event_name in PULL_REQUEST_EVENTS

    def pull_request_number(self) -> int | None:
        """The pull request this run is about, when the event says so."""
        event = self.event
        number: Any = None
        if self.is_pull_request:
            number = (event.get("pull_request") or {}).get("number") or event.get("number")
        elif self.event_name == "issue_comment":
            issue = event.get("issue") or {}
            number = issue.get("number") if "pull_request" in issue else None
        elif self.event_name == "workflow_run":
            # Empty for pull requests from forks: the fork-safe pattern carries the number itself.
            prs = (event.get("workflow_run") or {}).get("pull_requests") or []
            number = prs[0].get("number") if prs and isinstance(prs[0], dict) else None
        return number if isinstance(number, int) and number > 0 else None

    def is_fork_pull_request(self) -> bool:
        """True for a pull request whose head lives in another repository (read-only token)."""
        if not self.is_pull_request:
            return False
        pr = self.event.get("pull_request") or {}
        head = ((pr.get("head") or {}).get("repo") or {}).get("full_name")
        base = ((pr.get("base") or {}).get("repo") or {}).get("full_name")
        return bool(head and base and head != base)

    def pull_request_head_sha(self) -> str | None:
        pr = self.event.get("pull_request") or {}
        sha = (pr.get("head") or {}).get("sha")
        return sha if isinstance(sha, str) else None
