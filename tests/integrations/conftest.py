"""Integration-test fixtures: one thread, and no tracer left behind by a callback."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from traceml_ci.summary.schema import summary_problems
from traceml_ci.tracer import api


@contextlib.contextmanager
def one_thread_no_tracer() -> Iterator[None]:
    """One torch thread, and no tracer before or after: a callback starts the process's
    tracer, and whatever runs next must start from none. For a module-scoped run, which the
    autouse fixture (per test) does not cover."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    api.stop()
    try:
        yield
    finally:
        api.stop()
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_tracer_left() -> Iterator[None]:
    with one_thread_no_tracer():
        yield


def load_summary(out_dir: Path) -> dict[str, Any]:
    """``out_dir/final_summary.json``, checked against the schema."""
    doc = json.loads((out_dir / "final_summary.json").read_text())
    assert summary_problems(doc) == []
    return doc
