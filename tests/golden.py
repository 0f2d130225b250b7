"""Golden files: compare rendered text with a committed file; TRACEML_CI_REGEN_GOLDEN=1 rewrites
them (review with git diff)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REGEN = os.environ.get("TRACEML_CI_REGEN_GOLDEN") == "1"


def check_golden(path: Path, text: str, test_file: str) -> None:
    """``text`` must equal ``path``'s content; a missing file is written and fails once."""
    __tracebackhide__ = True
    if REGEN or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not REGEN:
            pytest.fail(f"{path} did not exist and was written; review it and rerun")
        return
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        pytest.fail(
            f"{path.name} differs from the golden file. If the change is intended, run\n"
            f"  TRACEML_CI_REGEN_GOLDEN=1 pytest {test_file}\nand review `git diff {path}`.\n\n"
            f"--- expected\n{expected}\n--- got\n{text}"
        )
