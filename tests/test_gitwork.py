"""gitwork.py on real repositories made here: which commit a ref stands for (a branch: its
merge-base with HEAD), and the temporary worktree gone however the block ends."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from traceml_ci.errors import UsageError
from traceml_ci.gitwork import resolve_base, toplevel, worktree


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """main: c1 -- c2 (HEAD, branch "feature" forked at c1 with c3)."""
    r = tmp_path / "r"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    (r / "f").write_text("c1")
    _git(r, "add", "f")
    _git(r, "commit", "-qm", "c1")
    _git(r, "branch", "feature")
    (r / "f").write_text("c2")
    _git(r, "commit", "-qam", "c2")
    _git(r, "checkout", "-q", "feature")
    (r / "g").write_text("c3")
    _git(r, "add", "g")
    _git(r, "commit", "-qm", "c3")
    _git(r, "checkout", "-q", "main")
    return r


def test_a_branch_is_its_merge_base_with_head_anything_else_as_it_is(repo) -> None:
    c1 = _git(repo, "rev-parse", "HEAD~1")
    c3 = _git(repo, "rev-parse", "feature")
    head = _git(repo, "rev-parse", "HEAD")
    feature = resolve_base(repo, "feature")
    assert (feature.commit, feature.how) == (c1, "merge-base")  # not c3: it forked after c1
    assert resolve_base(repo, "refs/heads/feature").commit == c1
    assert (resolve_base(repo, c3).commit, resolve_base(repo, c3).how) == (c3, "commit")
    assert resolve_base(repo, "HEAD~1").commit == c1
    own = resolve_base(repo, "HEAD")  # HEAD points at main, but names no branch itself
    assert (own.commit, own.how) == (head, "commit")
    for bad in ("nope", "-x", ""):
        with pytest.raises(UsageError, match="--base"):
            resolve_base(repo, bad)


def test_the_worktree_holds_the_commit_and_is_gone_after_an_error(repo) -> None:
    c1 = _git(repo, "rev-parse", "HEAD~1")
    with pytest.raises(RuntimeError), worktree(repo, c1) as path:
        assert (path / "f").read_text() == "c1"
        assert _git(path, "rev-parse", "HEAD") == c1
        assert toplevel(path).resolve() == path.resolve()
        seen = path
        raise RuntimeError("the A/B failed")
    assert not seen.exists() and not seen.parent.exists()
    assert len(_git(repo, "worktree", "list").splitlines()) == 1
