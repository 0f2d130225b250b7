"""Fixtures: a fake GitHub on 127.0.0.1 and a GitHub Actions environment pointing at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.github.fake_github import FakeGitHub

TOKEN = "ghs_fakeTOKENvalue0123456789abcdef"
REPO = "octo/widgets"
PR = 7


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    fake = FakeGitHub(TOKEN).start()
    fake.add_pr(REPO, PR)
    yield fake
    fake.stop()


@pytest.fixture
def gh_env(github: FakeGitHub, monkeypatch: pytest.MonkeyPatch, tmp_path) -> FakeGitHub:
    """GITHUB_* variables as a pull_request job would see them (no event file: --pr is passed)."""
    for name in ("GITHUB_EVENT_PATH", "GITHUB_EVENT_NAME", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GITHUB_API_URL", github.url)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    monkeypatch.setenv("GITHUB_JOB", "smoke")
    monkeypatch.setattr("traceml_ci.github.client.SERVER_ERROR_BACKOFF_S", 0.0)
    return github
