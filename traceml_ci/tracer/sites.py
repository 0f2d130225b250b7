"""Where a call came from, as a report prints it: ``file:line`` of the nearest frame of the
user's own code, never an absolute path.

The user's code is any file that is neither traceml-ci's, nor torch's, nor under a folder of
installed packages (sysconfig's purelib and platlib, ``site.getsitepackages()``, the user site,
and any ``site-packages`` / ``dist-packages`` folder on ``sys.path``), nor the standard library
(sysconfig's stdlib and platstdlib). Its path is relative to the run's root (``run_root``: the
pytest rootdir when the plugin runs it, else the git top level or the nearest pyproject.toml
folder above the working directory, else that directory), so runs from two checkouts agree; a
file of the user's outside the root is relative to the ``sys.path`` entry it was imported from,
else its bare name. With no user frame on the stack (a library's own thread), the nearest
library frame is named -- another library's before torch's -- relative to its site-packages
folder (``transformers/models/gpt2/modeling_gpt2.py:698``), then the standard library's
(``<stdlib>/threading.py:1012``).

One ``Sites`` per probe: the folders are read once, each file classified once.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Sequence
from typing import Any

#: What a file is.
USER, LIBRARY, STDLIB, OWN = "user", "library", "stdlib", "own"
#: Folders of installed packages, by name, wherever they are on ``sys.path``.
PACKAGE_FOLDERS = ("site-packages", "dist-packages")
#: Root markers, in order: a git checkout's top level (``.git``: a folder, or a file in a
#: worktree or submodule), then a Python project.
ROOT_MARKERS = (".git", "pyproject.toml")

_OWN_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_root(cwd: str | None = None) -> str:
    """The run's root for a plain run: the nearest folder at or above ``cwd`` (default: the
    working directory) holding ``.git``, else the nearest holding ``pyproject.toml``, else
    ``cwd`` itself."""
    start = os.path.abspath(cwd if cwd is not None else os.getcwd())
    for marker in ROOT_MARKERS:
        folder = start
        while True:
            if os.path.exists(os.path.join(folder, marker)):
                return folder
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return start


def _forms(path: str) -> set[str]:
    """A path as given (made absolute) and with its links resolved."""
    absolute = os.path.abspath(path)
    return {absolute, os.path.realpath(absolute)}


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class Sites:
    """Finds the site of a frame (``site``) and shows a file (``where``) as a report may.
    ``root``: the run's root (None: ``run_root()`` of the working directory now)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = os.path.abspath(root) if root is not None else run_root()
        self._roots = _forms(self.root)
        self._own = self._folders(_own_dirs())
        self._torch = self._folders(_torch_dirs())
        self._libraries = self._folders(_package_dirs())
        self._stdlib = self._folders(_stdlib_dirs())
        self._cache: dict[str, tuple[str, str]] = {}
        self._torch_files: dict[str, bool] = {}

    @staticmethod
    def _folders(paths: Sequence[str]) -> list[str]:
        """Each folder in both its forms, the longest first (the most specific wins)."""
        return sorted({f for p in paths if p for f in _forms(p)}, key=len, reverse=True)

    def where(self, filename: str, path: Sequence[str] | None = None) -> tuple[str, str]:
        """(``USER`` / ``LIBRARY`` / ``STDLIB`` / ``OWN``, the file as shown). ``path``: the
        import path a user file outside the root is shown relative to (default ``sys.path``)."""
        if path is None:
            hit = self._cache.get(filename)
            if hit is None:
                hit = self._cache[filename] = self._classify(filename, sys.path)
            return hit
        return self._classify(filename, path)

    def _classify(self, filename: str, path: Sequence[str]) -> tuple[str, str]:
        if filename.startswith("<"):  # <string>, <stdin>: the user's; <frozen ...>: Python's
            return (STDLIB if filename.startswith("<frozen") else USER), filename
        forms = _forms(filename)
        if _inside(forms, self._own):
            return OWN, os.path.basename(filename)
        for kind, folders, above in ((LIBRARY, self._torch, True),
                                     (LIBRARY, self._libraries, False),
                                     (STDLIB, self._stdlib, False)):
            shown = _relative(forms, folders, parent=above)
            if shown is not None:
                return kind, ("<stdlib>/" + shown if kind == STDLIB else shown)
        shown = _relative(forms, self._roots)
        if shown is None:
            entries = [e for e in path if isinstance(e, str) and e]
            shown = _relative(forms, self._folders(entries))
        return USER, shown if shown is not None else os.path.basename(filename)

    def site(self, frame: Any) -> str:
        """``file:line`` of the nearest user frame from ``frame`` outwards; with none, of the
        nearest library frame not torch's, then torch's, then the standard library's ("?":
        no frame but traceml-ci's)."""
        fallback: dict[int, str] = {}
        while frame is not None:
            filename = frame.f_code.co_filename
            kind, shown = self.where(filename)
            if kind == USER:
                return f"{shown}:{frame.f_lineno}"
            if kind != OWN:
                rank = 2 if kind == STDLIB else 1 if self.is_torch(filename) else 0
                fallback.setdefault(rank, f"{shown}:{frame.f_lineno}")
            frame = frame.f_back
        return fallback[min(fallback)] if fallback else "?"

    def is_torch(self, filename: str) -> bool:
        """Whether ``filename`` is torch's own Python."""
        hit = self._torch_files.get(filename)
        if hit is None:
            hit = self._torch_files[filename] = not filename.startswith("<") and _inside(
                _forms(filename), self._torch)
        return hit

    def is_own(self, filename: str) -> bool:
        """Whether ``filename`` is traceml-ci's (or its pytest plugin's)."""
        return self.where(filename)[0] == OWN


def _inside(forms: set[str], folders: Sequence[str]) -> bool:
    return any(_under(f, d) for d in folders for f in forms)


def _relative(forms: set[str], folders: Sequence[str], parent: bool = False) -> str | None:
    """The file relative to the first (longest) folder it is under (``parent``: to that
    folder's parent, so that the folder's name leads), with ``/`` between parts."""
    for folder in folders:
        for f in forms:
            if _under(f, folder):
                base = os.path.dirname(folder.rstrip(os.sep)) if parent else folder
                return os.path.relpath(f, base).replace(os.sep, "/")
    return None


def _own_dirs() -> list[str]:
    """traceml-ci's package, and its pytest plugin's beside it (one distribution)."""
    plugin = os.path.join(os.path.dirname(_OWN_PACKAGE), "pytest_plugin")
    ours = os.path.isfile(os.path.join(plugin, "__init__.py"))
    return [_OWN_PACKAGE, plugin] if ours else [_OWN_PACKAGE]


def _torch_dirs() -> list[str]:
    torch = sys.modules.get("torch")
    file = getattr(torch, "__file__", None)
    return [os.path.dirname(os.path.abspath(file))] if file else []


def _package_dirs() -> list[str]:
    dirs = [sysconfig.get_paths().get(k, "") for k in ("purelib", "platlib")]
    try:
        dirs += list(site.getsitepackages())
    except Exception:  # an old virtualenv's site module has none
        pass
    try:
        dirs.append(site.getusersitepackages())
    except Exception:
        pass
    dirs += [e for e in sys.path
             if isinstance(e, str) and os.path.basename(e.rstrip(os.sep)) in PACKAGE_FOLDERS]
    return dirs


def _stdlib_dirs() -> list[str]:
    return [sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib")]
