"""Distributed runs for real: examples/train_ddp.py under plain torchrun (the script calls
traceml.init()), two CPU ranks over gloo. Each rank's summary is gathered at finish; rank 0
writes one merged summary naming the straggler and its cause from each rank's own work.
Through `traceml-ci run --nproc-per-node`: tests/cli/test_run_distributed.py.

Three jobs: balanced (the group destroyed: the tracer finishes there), the README's loop
(finish first) with a slow forward -- both shared with tests/cli/test_run_distributed.py
(tests/distributed_jobs.py) --, and a job that never destroys its group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import distributed_jobs as jobs
from tests.distributed_checks import assert_no_confident_straggler
from tests.distributed_jobs import merged, torchrun


def test_balanced_ranks_merge_into_one_summary(tmp_path_factory: pytest.TempPathFactory) -> None:
    done = jobs.balanced(tmp_path_factory)
    assert done.returncode == 0, done.stdout
    doc = merged(done.out)
    dist = doc["distributed"]
    assert (dist["world_size"], dist["ranks_reported"], dist["backend"]) == (2, 2, "gloo")
    assert dist["nodes"] == 1
    assert_no_confident_straggler(dist)  # on a loaded machine, at most a marginal one
    assert [r["rank"] for r in dist["ranks"]] == [0, 1]
    assert [r["local_rank"] for r in dist["ranks"]] == [0, 1]
    for r in (0, 1):  # every rank keeps its own summary too
        own = json.loads((done.out / f"final_summary.rank{r}.json").read_text())
        assert own["run"]["rank"] == r and "distributed" not in own


def test_a_rank_slow_in_forward_is_named_a_compute_straggler(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    done = jobs.slow_forward(tmp_path_factory)
    assert done.returncode == 0, done.stdout
    dist = merged(done.out)["distributed"]
    s = dist["straggler"]
    slow, other = jobs.SLOW_FORWARD_RANK, 1 - jobs.SLOW_FORWARD_RANK
    assert (s["label"], s["rank"], s["cause"]) == ("COMPUTE_STRAGGLER", slow, "forward")
    ranks = {r["rank"]: r for r in dist["ranks"]}
    # The other rank waited for it, in the wait phase now (no longer inside its backward).
    assert ranks[other]["wait_ms"] > ranks[slow]["wait_ms"]


def test_a_script_that_never_destroys_its_group_still_merges(tmp_path: Path) -> None:
    done = torchrun(tmp_path, "--no-destroy", "--slow-rank", "1", "--slow", "data",
                    env={"OMP_NUM_THREADS": "1"})  # (unset, torchrun warns)
    assert done.returncode == 0, done.stdout
    assert merged(tmp_path)["distributed"]["straggler"]["rank"] == 1


def test_finish_before_destroy_gathers_at_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The output folder's claim was held across the gather, so one rank waited on the other's
    lock while that one waited in the gather: a stall until the gather timed out, and no
    merged summary."""
    done = jobs.slow_forward(tmp_path_factory)
    assert done.returncode == 0, done.stdout
    assert "failed" not in done.stdout and "warning" not in done.stdout, done.stdout
    dist = merged(done.out)["distributed"]
    assert (dist["world_size"], dist["ranks_reported"]) == (2, 2)
    # both ranks' own work reached rank 0's merge
    assert dist["straggler"]["rank"] == jobs.SLOW_FORWARD_RANK
    assert done.seconds < 90, f"the finish stalled: {done.seconds:.0f} s"
