"""The architecture as written down (docs/architecture.md), checked on every run: the layers'
and the gate's import contracts (pyproject.toml ``[tool.importlinter]``, import-linter), the
gate's size by module, and no hand-written function radon grades E or F."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "traceml_ci" / "gate"
#: Modules directly in traceml_ci/gate (its __init__ included); the rest sit in subpackages.
GATE_MODULES_MAX = 12
#: Lines in any one module of the gate.
GATE_MODULE_LINES_MAX = 450
#: The Python we ship, graded by radon; generated code (fastjsonschema's) is not written by hand.
HAND_WRITTEN = ("traceml_ci", "pytest_plugin")
GENERATED = "_schema_"


def test_the_import_contracts_hold() -> None:
    """Layers: front doors over tracer | gate over summary; the gate's subpackages in one order,
    so no circle. ``lint-imports`` reads the contracts from pyproject.toml."""
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout, out.stdout


def test_the_gate_is_a_few_modules_and_subpackages_of_short_modules() -> None:
    direct = sorted(p.name for p in GATE.glob("*.py"))
    assert len(direct) <= GATE_MODULES_MAX, direct
    long = {str(p.relative_to(GATE)): n for p in GATE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > GATE_MODULE_LINES_MAX}
    assert not long, long
    for package in (p for p in GATE.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        assert (package / "__init__.py").read_text().startswith('"""'), package  # says what


def test_no_hand_written_function_is_graded_e_or_f_by_radon() -> None:
    radon = pytest.importorskip("radon.complexity")
    worst = []
    for folder in HAND_WRITTEN:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if GENERATED in path.name:
                continue
            for block in radon.cc_visit(path.read_text()):
                if radon.cc_rank(block.complexity) in ("E", "F"):
                    where = f"{path.relative_to(ROOT)}:{block.lineno} {block.name}"
                    worst.append(f"{where} {radon.cc_rank(block.complexity)} "
                                 f"({block.complexity})")
    assert not worst, "\n".join(worst)
