"""Run ``traceml-ci`` in a child that file permissions bind, as they bind a user's shell.

Root is let past every permission (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER), so as root
the child runs under util-linux's ``setpriv`` without those capabilities; a user runs it as is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: The capabilities that let root read, traverse and write what its modes forbid.
_PAST_PERMISSIONS = "-dac_override,-dac_read_search,-fowner"


def bound_by_permissions() -> list[str]:
    """The prefix that makes a command obey file modes (empty for a user); skips the test where
    root cannot shed its capabilities."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv (util-linux) cannot be denied a folder")
    return [setpriv, f"--inh-caps={_PAST_PERMISSIONS}", f"--bounding-set={_PAST_PERMISSIONS}"]


def cli_denied(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``traceml-ci argv`` in ``cwd``, bound by file modes; its exit code, stdout and stderr."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    env.pop("TRACEML_CI_DEBUG", None)
    return subprocess.run([*bound_by_permissions(), sys.executable, "-m", "traceml_ci", *argv],
                          cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
