"""What the A/B tests (``traceml-ci ab``, ``pytest --traceml-ab``) share: a real git repository
made in a tmp folder, a base commit then a head commit, and the spinning model both sides train."""

from __future__ import annotations

import subprocess
from pathlib import Path

#: A linear layer whose forward spins SPIN_MS first (busy: a loaded machine cannot make it
#: shorter, only longer); ``spinning`` gives a side its own SPIN_MS.
SPIN_NET = """\
import time

import torch

torch.set_num_threads(1)
SPIN_MS = 0.0


class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        end = time.perf_counter() + SPIN_MS / 1000.0
        while time.perf_counter() < end:
            pass
        return self.fc(x)
"""


def spinning(source: str, ms: float) -> str:
    """``source`` (which holds SPIN_NET) with its forward spinning ``ms`` per call."""
    assert "SPIN_MS = 0.0\n" in source
    return source.replace("SPIN_MS = 0.0\n", f"SPIN_MS = {ms}\n", 1)


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS`` with an author set; its stdout (a failure raises)."""
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def commit(repo: Path, message: str, files: dict[str, str]) -> None:
    """Write ``files`` (name -> text) into ``repo`` and commit everything as ``message``
    (the repository is made on the first commit)."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q")
    for name, text in files.items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


def worktrees(repo: Path) -> list[str]:
    """The ``worktree PATH`` lines git lists for ``repo`` (the repository itself first)."""
    return [line for line in git(repo, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]  # fmt: skip


def only_the_repository(repo: Path) -> bool:
    """No other worktree is left: the base's checkout is gone."""
    return worktrees(repo) == [f"worktree {repo.resolve()}"]
