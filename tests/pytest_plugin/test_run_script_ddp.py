"""``traceml.run_script(..., nproc_per_node=2)``: a DDP job on CPU/gloo launched through
torchrun from a real pytest session, its merged summary gated (a new straggler fails the test).
"""

from __future__ import annotations

from pathlib import Path

from tests.distributed_checks import assert_no_confident_straggler
from tests.pytest_plugin.conftest import SmokeProject

#: The example DDP job (rank --slow-rank slowed in its dataset's __getitem__), copied into the
#: pytester project as it is.
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"

DDP_TEST = '''
import os


def test_ddp(traceml):
    args = ["--steps", "30"]
    slow = os.environ.get("DDP_SLOW_RANK")
    if slow:
        args += ["--slow-rank", slow, "--slow", "data", "--slow-ms", "8"]
    summary = traceml.run_script("train_ddp.py", *args, nproc_per_node=2, timeout_s=180,
                                 env={"OMP_NUM_THREADS": "1", "TRACEML_CI_LIVE": "0"})
    dist = summary["distributed"]
    assert (dist["world_size"], dist["ranks_reported"], dist["failed_ranks"]) == (2, 2, [])
    assert [r["rank"] for r in dist["ranks"]] == [0, 1]
    if slow:
        assert (dist["straggler"]["label"], dist["straggler"]["rank"]) == (
            "INPUT_STRAGGLER", int(slow))
'''

FAST = ["--traceml-confirm=0", "--traceml-baseline-runs=1", "--traceml-repeats=1"]


def test_ddp_script_records_a_baseline_then_a_new_straggler_fails(smoke: SmokeProject) -> None:
    smoke.pytester.makepyfile(train_ddp=EXAMPLE.read_text(encoding="utf-8"))
    smoke.tests(DDP_TEST, name="test_ddp")
    smoke.monkeypatch.delenv("DDP_SLOW_RANK", raising=False)
    recorded = smoke.run("--traceml-update-baseline", *FAST)
    recorded.assert_outcomes(passed=1)
    stored = smoke.baseline_summaries()["test_ddp.py::test_ddp"]["distributed"]
    # RANKS_BALANCED; on a loaded machine at most a marginal straggler (docs/distributed.md),
    # which the new input straggler (64 ms of input a step) is worse than all the same.
    assert_no_confident_straggler(stored)
    before = stored["straggler"]["label"]

    smoke.monkeypatch.setenv("DDP_SLOW_RANK", "1")
    gated = smoke.run(*FAST)
    gated.assert_outcomes(failed=1)
    gated.stdout.fnmatch_lines([f"*distributed.straggler.label*{before}*INPUT_STRAGGLER*"])


def test_nproc_per_node_must_be_a_whole_number(smoke: SmokeProject) -> None:
    smoke.tests('''
def test_bad(traceml):
    traceml.run_script("missing.py", nproc_per_node=0)
''', name="test_bad")
    result = smoke.run(gate=False)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*nproc_per_node must be a whole number ≥ 1, not 0*"])
