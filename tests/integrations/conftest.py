"""Integration-test fixtures: one thread, and no tracer left behind by a callback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from traceml_ci.summary.schema import summary_problems
from traceml_ci.tracer import api


@pytest.fixture(autouse=True)
def _no_tracer_left(torch_single_thread: None) -> Iterator[None]:
    """A callback starts the process's tracer; the next test must start from none."""
    api.stop()
    yield
    api.stop()


def load_summary(out_dir: Path) -> dict[str, Any]:
    """``out_dir/final_summary.json``, checked against the schema."""
    doc = json.loads((out_dir / "final_summary.json").read_text())
    assert summary_problems(doc) == []
    return doc
