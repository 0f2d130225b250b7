"""A light install: without torch, the gate's commands work and tracing says in one line that it
needs torch. torch is blocked in a fresh interpreter by a finder that refuses to import it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import FIXTURES
from traceml_ci.errors import ExitCode
from traceml_ci.summary.model import RunStatus
from traceml_ci.tracer.fallback import write_fallback_summary

NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
"""

CLI = NO_TORCH + "from traceml_ci.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"


def _no_torch(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_gate_commands_work_without_torch(tmp_path) -> None:
    traceml = FIXTURES / "traceml-ai-0.5.0" / "input_bound.json"
    proc = _no_torch(CLI, "diff", str(traceml), str(traceml), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ours = write_fallback_summary(tmp_path / "s.json", "r", time.time(), RunStatus.COMPLETED)
    proc = _no_torch(CLI, "validate", str(ours), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = _no_torch(CLI, "comment", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage: traceml-ci comment" in proc.stdout


def test_run_without_torch_says_so_in_one_line(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').close()\n")
    proc = _no_torch(CLI, "run", str(script), cwd=tmp_path)
    assert proc.returncode == ExitCode.MISSING_DEPENDENCY == 6
    assert proc.stderr == (
        "traceml-ci: error: tracing needs PyTorch, which is not installed in this environment "
        "(install the torch build you train with, e.g. pip install torch)\n"
    )
    assert not (tmp_path / "ran").exists()


def test_init_without_torch_raises_a_clear_import_error(tmp_path) -> None:
    code = NO_TORCH + (
        "import traceml_ci as traceml\n"
        "try:\n    traceml.init()\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    proc = _no_torch(code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "traceml_ci: tracing needs PyTorch, which is not installed in this environment "
        "(install the torch build you train with, e.g. pip install torch)\n"
    )
    assert not (tmp_path / "traceml-out").exists()
