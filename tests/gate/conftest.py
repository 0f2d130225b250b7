"""Gate test fixtures: summaries of real traced loops, recorded once per session."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def traced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """name -> a real traced loop's summary (tests/gate/traced.py: ``base`` and variants that
    each change one thing)."""
    from tests.gate.traced import record

    return record(tmp_path_factory.mktemp("traced"))
