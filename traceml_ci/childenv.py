"""The environment a process we start runs in: ours (or the one given), with changes. The one
place that copies the environment for a child -- the launcher (``tracer/launch.py``), git
(``gitwork.py``) and the pytest plugin's scripts (``pytest_plugin/scripts.py``) ask it.

The lowest module beside ``errors.py``: stdlib only, so every layer may import it."""

from __future__ import annotations

import os
from collections.abc import Mapping


def child_env(base: Mapping[str, str] | None = None,
              changes: Mapping[str, str] | None = None) -> dict[str, str]:
    """A fresh copy of ``base`` (default: this process's environment) with ``changes`` set."""
    env = dict(os.environ if base is None else base)
    env.update(changes or {})
    return env
