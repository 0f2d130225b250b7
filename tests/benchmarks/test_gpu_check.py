"""benchmarks/gpu_check.py stays runnable: its checks on CPU here, all of them on a CUDA GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


def test_gpu_check_runs_its_checks_on_cpu() -> None:
    # torch.compile alone takes ~20 s on this CPU; the rest is a few seconds.
    proc = _run("--device", "cpu", "--quick", "--skip", "torch.compile", timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = {ln.split()[0] for ln in lines}
    assert status <= {"PASS", "SKIP"}, proc.stdout
    assert sum(ln.startswith("PASS") for ln in lines) >= 4, proc.stdout  # events, A/B, DDP, wait
    assert len(lines) == 11, proc.stdout  # one line a check


@pytest.mark.cuda
def test_gpu_check_passes_on_a_cuda_gpu() -> None:
    proc = _run(timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
