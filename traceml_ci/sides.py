"""A/B's two sides, for both front doors (``traceml-ci ab`` and ``pytest --traceml-ab``): the
head's tree (the repository as it is) and the base's worktree -- checked out on first use, the
user's setup command run there once, removed at the end however the run ends (SIGTERM unwinds
like Ctrl-C) -- and a child process run in a side's tree, its output in a log.

What a side's child is (a traced script, a pytest session) and how its figures are read stays
with each front door; where and how it runs is here, once.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType

from traceml_ci.errors import ExitCode, TracemlError
from traceml_ci.gitwork import side_env, worktree

#: The sides, in the order a report names them.
BASE, HEAD = "base", "head"


class SideFailed(TracemlError):
    """One side's run (or the base's setup) failed: there is nothing to compare (exit 3)."""

    exit_code = ExitCode.INCOMPARABLE


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While it lasts, SIGTERM raises KeyboardInterrupt: the run unwinds as on Ctrl-C, so the
    base's worktree is removed. Off the main thread signals are left alone."""

    def unwind(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, unwind)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def stopped(code: int) -> bool:
    """Whether a child's exit code says it was stopped by SIGINT or SIGTERM (as we are, then):
    negative from subprocess, 128 + N from a shell or a launcher that forwards the signal."""
    return code in (-signal.SIGINT, -signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGTERM)


class Sides:
    """The two trees of an A/B: ``repo`` (the head) and ``commit`` checked out beside it (the
    base) on first use; ``rel``: the folder inside the repository each side's child runs in.
    ``setup``: a shell command run once in the base's worktree before its first child
    (``setup_flag`` names it in the one line a failure says). A context manager: leaving it
    removes the worktree."""

    def __init__(self, repo: Path, commit: str, rel: Path = Path(), *,
                 setup: str | None = None, setup_flag: str = "--base-setup") -> None:
        self.repo, self.commit, self.rel = repo, commit, rel
        self.setup, self.setup_flag = setup, setup_flag
        self._stack: ExitStack | None = None
        self._base: Path | None = None
        self._setup_failed: str | None = None

    def __enter__(self) -> Sides:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def root(self, side: str, setup_log: Path | None = None) -> Path:
        """The tree ``side`` runs in; the base's is checked out (and set up, its output in
        ``setup_log``) on first use. Raises SideFailed while the setup's failure stands."""
        if side == HEAD:
            return self.repo
        if self._base is None and self._setup_failed is None:
            self._stack = ExitStack()
            self._stack.enter_context(sigterm_unwinds())
            self._base = self._stack.enter_context(worktree(self.repo, self.commit))
            if self.setup:
                self._run_setup(self._base, setup_log or self._base.parent / "base-setup.log")
        if self._setup_failed is not None or self._base is None:
            raise SideFailed(self._setup_failed or "the base's worktree is gone")
        return self._base

    def cwd(self, side: str) -> Path:
        """Where ``side``'s child runs: its tree's counterpart of ``rel``."""
        return self.root(side) / self.rel

    def env(self, side: str) -> dict[str, str]:
        """``side``'s child environment: its tree first on ``PYTHONPATH`` (gitwork.side_env)."""
        return side_env(self.root(side))

    def call(self, side: str, argv: Sequence[str], log: Path) -> int:
        """Run ``argv`` in ``side``'s folder, its output in ``log``; its exit code. A child
        stopped by SIGINT or SIGTERM stops us too (KeyboardInterrupt)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as f:
            code = subprocess.call(list(argv), cwd=self.cwd(side), env=self.env(side),
                                   stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if stopped(code):
            raise KeyboardInterrupt
        return code

    def _run_setup(self, root: Path, log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as f:
            code = subprocess.call(self.setup or "", shell=True, cwd=root, stdout=f,
                                   stderr=subprocess.STDOUT, env=side_env(root),
                                   stdin=subprocess.DEVNULL)
        if code != 0:  # every later use of the base says this line; nothing runs there
            self._setup_failed = (f"{self.setup_flag} exited {code} in the base worktree "
                                  f"(its output: {log})")

    def close(self) -> None:
        """Remove the base's worktree (idempotent)."""
        stack, self._stack, self._base = self._stack, None, None
        if stack is not None:
            stack.close()
