"""A fake installed library for the tests of where a call came from (tracer/sites.py): a
package written into a folder named ``site-packages`` that is put on ``sys.path``, as a
virtualenv's is, whose functions read a tensor and make one on the user's behalf."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

NAME = "fakelib"
SOURCE = '''\
import sys


def read(loss):
    return loss.item()


def scaled(t):
    return t * 2


def call(fn):
    return fn()


def here():
    return sys._getframe()


def frame_into(out):
    out.append(sys._getframe())
'''


def line(text: str) -> int:
    """The line of SOURCE that holds ``text``."""
    return next(i for i, src in enumerate(SOURCE.splitlines(), 1) if text in src)


def install(folder: Path, monkeypatch) -> ModuleType:  # noqa: ANN001
    """Write the library under ``folder/venv/lib/python3/site-packages``, put that folder first
    on ``sys.path`` (undone with ``monkeypatch``) and import it."""
    site = folder / "venv" / "lib" / "python3" / "site-packages"
    (site / NAME).mkdir(parents=True)
    (site / NAME / "__init__.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, NAME, raising=False)
    module = importlib.import_module(NAME)
    monkeypatch.setitem(sys.modules, NAME, module)  # gone again at the test's end
    return module
