"""Git for A/B runs (``traceml-ci ab``, the pytest plugin's ``--traceml-ab``): the repository,
the base commit a ref stands for, that commit checked out as a temporary worktree, removed again
however the run ends, and the environment a side runs in (its tree first on ``PYTHONPATH``).

Torch-free, stdlib only. Errors are typed (``UsageError``: exit 2; no git: exit 6).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from traceml_ci.childenv import child_env
from traceml_ci.errors import MissingDependencyError, UsageError, one_line

#: Refs under these are branches: the base is their merge-base with HEAD, as a pull request's
#: diff is taken (a branch that moved on since HEAD forked from it does not count its new work).
BRANCH_PREFIXES = ("refs/heads/", "refs/remotes/")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(changes={"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise MissingDependencyError(
            "git is not installed (ab checks the base out with it)"
        ) from None


def toplevel(cwd: str | os.PathLike[str]) -> Path:
    """The work tree's top folder holding ``cwd``; UsageError outside a git repository."""
    done = _git(Path(cwd), "rev-parse", "--show-toplevel")
    if done.returncode != 0 or not done.stdout.strip():
        raise UsageError(
            f"{one_line(os.fspath(cwd))}: not inside a git repository "
            "(ab checks the base out from it)"
        )
    return Path(done.stdout.strip())


@dataclass(frozen=True)
class Base:
    """The commit the base side runs, and how it was found from the ref the user gave."""

    ref: str
    commit: str
    #: "merge-base" (``ref`` is a branch) or "commit" (a commit, tag or expression like HEAD~1)
    how: str


def resolve_base(repo: Path, ref: str, flag: str = "--base") -> Base:
    """The base commit for ``ref``: a branch's merge-base with HEAD; anything else as it is.
    ``flag``: the option the user gave ``ref`` with, as errors name it."""
    if not ref or ref.startswith("-"):
        raise UsageError(f"{flag} {one_line(ref)!r}: not a git ref")
    done = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    commit = done.stdout.strip()
    if done.returncode != 0 or not commit:
        raise UsageError(f"{flag} {one_line(ref)!r}: no such commit, branch or tag in {repo}")
    if not _is_branch(repo, ref):
        return Base(ref, commit, "commit")
    merged = _git(repo, "merge-base", "HEAD", commit)
    if merged.returncode != 0 or not merged.stdout.strip():
        raise UsageError(f"{flag} {one_line(ref)!r}: the branch shares no history with HEAD")
    return Base(ref, merged.stdout.strip(), "merge-base")


def _is_branch(repo: Path, ref: str) -> bool:
    """Whether ``ref`` names a local or remote-tracking branch (``main``, ``origin/main``,
    ``refs/heads/main``) -- not HEAD, which points at one, nor a commit or tag."""
    if ref.startswith(BRANCH_PREFIXES):
        names = [ref]
    else:
        names = [prefix + ref for prefix in BRANCH_PREFIXES]
    return any(_git(repo, "show-ref", "--verify", "--quiet", name).returncode == 0
               for name in names)  # fmt: skip


@contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """``commit`` checked out (detached) in a new temporary folder; the worktree and the folder
    are removed on the way out, whatever the way (an error, Ctrl-C). Submodules are not
    checked out, nor is anything git ignores (build outputs, compiled extensions)."""
    parent = Path(tempfile.mkdtemp(prefix="traceml-ab-"))
    path = parent / "base"
    try:
        done = _git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
        if done.returncode != 0:
            raise UsageError(
                f"cannot check the base {commit[:12]} out: "
                f"{one_line(done.stderr.strip() or done.returncode)}"
            )
        yield path
    finally:
        _git(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)
        _git(repo, "worktree", "prune")


def side_env(root: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one side's runs: its worktree (and its ``src/`` when there is one)
    first on PYTHONPATH, so each side imports its own code, not an installed copy."""
    out = child_env(env, {})
    paths = [str(root)] + ([str(root / "src")] if (root / "src").is_dir() else [])
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    return out
