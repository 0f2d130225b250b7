"""FSDP2 (``fully_shard``) on CPU/gloo under ``traceml-ci run --nproc-per-node 2``
(tests/cli/fsdp_job.py): every rank traced, one merged summary; FSDP's all-gathers and
reduce-scatters are the wait phase, as long as a stopwatch around them, so the rank the others
wait for is named with the phase it is slow in, forward or backward."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_run_distributed import _finish, _free_port, _merged, _start
from tests.distributed_checks import assert_no_confident_straggler

SCRIPT = Path(__file__).with_name("fsdp_job.py")


def _run(tmp_path: Path, slow: str) -> dict[str, Any]:
    code, out = _finish(_start(tmp_path, "--out", "out", "--nproc-per-node", "2",
                               "--master-port", str(_free_port()), str(SCRIPT), slow))
    assert code == 0, out
    return _merged(tmp_path / "out" / "final_summary.json")


def test_fsdp_collectives_are_wait_as_long_as_a_stopwatch_around_them(tmp_path: Path) -> None:
    doc = _run(tmp_path, "none")
    dist = doc["distributed"]
    assert (dist["world_size"], dist["ranks_reported"], dist["backend"]) == (2, 2, "gloo")
    assert doc["run"]["status"] == "completed" and doc["run"]["parallelism"] == "fsdp"
    for rank in (0, 1):
        st = json.loads((tmp_path / "out" / f"final_summary.rank{rank}.json").read_text())
        st = st["step_time"]
        assert st["steps_analyzed"] == 27
        watch = json.loads((tmp_path / f"stopwatch.rank{rank}.json").read_text())["waited_ms"]
        watched = statistics.median(watch[st["warmup_steps"]:])
        # Untimed, the gathers and reduce-scatters were forward and backward: 60-70 % of
        # these steps on gloo.
        off_pp = 100.0 * abs(st["phase_ms"]["wait"] - watched) / st["step_ms"]["median"]
        assert off_pp <= 2.0, (rank, st["phase_ms"], watched)
        assert st["phase_ms"]["forward"] > 0 and st["phase_ms"]["backward"] > 0
    # The evidence is the waits: balanced ranks get the balanced label, not "not analysed"
    # (on a loaded machine, at most a marginal straggler: docs/distributed.md).
    assert dist["straggler"]["evidence"] == "wait"
    assert dist["straggler"]["label"] is not None, dist["straggler"]
    assert_no_confident_straggler(dist)


@pytest.mark.parametrize("slow", ["forward", "backward"])
def test_the_fsdp_rank_the_others_wait_for_is_named_with_its_phase(
    tmp_path: Path, slow: str
) -> None:
    """Rank 1 takes 25 ms more a step in ``slow``: rank 0 waits that much longer in the collectives,
    and rank 1 is the straggler, in that phase (backward's own compute included)."""
    block = _run(tmp_path, slow)["distributed"]
    straggler = block["straggler"]
    assert (straggler["label"], straggler["rank"], straggler["cause"]) == (
        "COMPUTE_STRAGGLER", 1, slow), json.dumps(block)
    assert straggler["lateness_ms"] > 4.0, json.dumps(straggler)
    # Rank 0's wait splits into the collectives' own time (rank 1's whole wait: it arrives
    # last) and waiting for rank 1.
    rows = {r["rank"]: r for r in block["ranks"]}
    assert block["transfer_ms"] == rows[1]["wait_ms"] and rows[1]["waiting_ms"] == 0.0
    assert rows[0]["waiting_ms"] > 4.0, json.dumps(block)
