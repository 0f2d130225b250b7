"""Sessions that several tests assert different things on, run once per test session.

A module-scoped fixture runs once per pytest-xdist worker that runs one of its tests, and xdist
spreads a module's tests over its workers (the first quarter of a run's tests is dealt out one
by one): a fixture of real sessions, each importing torch, would then run twice. Here the first
worker to ask runs them and leaves their results beside the workers' temporary folders; another
that asks meanwhile waits for them (idle: the sessions use the CPUs) and reads them.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from typing import Any

import pytest


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str,
                     produce: Callable[[], Any]) -> Any:
    """``produce()``'s result (JSON data), produced once per test session. A worker whose
    ``produce()`` raises leaves nothing: the next worker to ask produces it again."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return json.loads(json.dumps(produce()))  # the same data as a worker reads
    root = tmp_path_factory.getbasetemp().parent  # the workers' common folder
    done = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.is_file():
            data = produce()
            done.with_suffix(".tmp").write_text(json.dumps(data))
            done.with_suffix(".tmp").replace(done)
    return json.loads(done.read_text())


def result_data(result: pytest.RunResult) -> dict[str, Any]:
    """A session's result as JSON data (``result_from``)."""
    return {"ret": int(result.ret), "outlines": result.outlines, "errlines": result.errlines,
            "duration": result.duration}


def result_from(data: dict[str, Any]) -> pytest.RunResult:
    """The session's result again, to assert on as on pytester's."""
    return pytest.RunResult(data["ret"], data["outlines"], data["errlines"], data["duration"])
