"""Cross-rank merge and stragglers named by cause (traceml_ci.summary.ranks), on summaries built
from a real one with known per-rank phase times."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gate.summaries import make, shift
from traceml_ci.summary.ranks import (
    BALANCED,
    COMPUTE_STRAGGLER,
    INPUT_STRAGGLER,
    MAX_RANKS_LISTED,
    STRAGGLER,
    merge_ranks,
)
from traceml_ci.summary.schema import summary_problems


def rank(r: int, ms: dict[str, float] | None = None, **extra: Any) -> dict[str, Any]:
    doc = make(ms)
    doc["run"].update(rank=r, local_rank=r % 2, host=f"node{r // 2}", world_size=4, **extra)
    return doc


def test_balanced_ranks() -> None:
    docs = [rank(r, shift(forward=0.1 * r)) for r in range(4)]
    out = merge_ranks(docs, world_size=4, nodes=2, backend="gloo")
    assert summary_problems(out) == []
    dist = out["distributed"]
    assert dist["straggler"]["label"] == BALANCED and dist["straggler"]["rank"] is None
    assert [r["rank"] for r in dist["ranks"]] == [0, 1, 2, 3]
    assert dist["ranks"][3]["host"] == "node1"
    assert any(d["kind"] == BALANCED and d["area"] == "distributed" for d in out["diagnoses"])


def test_a_rank_slow_in_its_dataloader_is_an_input_straggler_not_the_waiters() -> None:
    # Rank 1 waits 6 ms more for data; the others wait for it inside backward (all-reduce).
    docs = [
        rank(0, shift(backward=6.0)),
        rank(1, shift(dataloader=6.0)),
        rank(2, shift(backward=6.0)),
        rank(3, shift(backward=6.0)),
    ]
    out = merge_ranks(docs, world_size=4)
    s = out["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == (INPUT_STRAGGLER, 1, "dataloader")
    assert s["score_pct"] > 15
    diag = next(d for d in out["diagnoses"] if d["area"] == "distributed")
    assert "Rank 1" in diag["message"] and "Rank 1" in diag["next_step"]
    # The job's split is the straggler's own (the critical path), never a blend of ranks.
    assert out["distributed"]["headline_rank"] == 1
    assert out["step_time"] == docs[1]["step_time"]
    assert summary_problems(out) == []


def test_a_balanced_job_slowed_alike_by_a_loaded_cpu_is_not_a_straggler() -> None:
    # Measured beside two busy loops on 2 vCPUs, a balanced tiny job: one rank's own work was
    # +36 % in every phase (1.60 vs 1.18 ms), past both percentages, yet a fraction of one
    # scheduler time slice.
    small = {"dataloader": 0.23, "forward": 0.38, "backward": 6.37, "optimizer": 0.33,
             "other": 0.23}
    slowed = {"dataloader": 0.32, "forward": 0.56, "backward": 4.49, "optimizer": 0.43,
              "other": 0.29}
    s = merge_ranks([rank(0, slowed), rank(1, small)], world_size=2)["distributed"]["straggler"]
    assert s["score_pct"] > 15 and (s["label"], s["rank"]) == (BALANCED, None)


def test_an_excess_within_the_runs_window_noise_is_not_a_straggler() -> None:
    # 3 ms more forward on a rank whose own work moves by ~3.7 ms between windows of the run.
    noisy = [rank(0, shift(forward=3.0)), rank(1, shift(backward=3.0))]
    for pct in noisy[0]["step_time"]["noise"]["pct"].values():
        pct["iqr"] = 4.0  # pp per own-work phase: 16 % of a 23 ms step
    s = merge_ranks(noisy, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"]) == (BALANCED, None) and "noisy" in s
    # The same excess, steady across the windows, is named.
    steady = [rank(0, shift(forward=3.0)), rank(1, shift(backward=3.0))]
    s = merge_ranks(steady, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"]) == (COMPUTE_STRAGGLER, 0)


def test_a_rank_slow_in_forward_is_a_compute_straggler() -> None:
    docs = [rank(0, shift(forward=4.0)), rank(1, shift(backward=4.0))]
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == (COMPUTE_STRAGGLER, 0, "forward")


def test_extra_work_outside_the_model_is_a_plain_straggler() -> None:
    docs = [rank(0, shift(other=5.0)), rank(1), rank(2)]
    s = merge_ranks(docs, world_size=3)["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == (STRAGGLER, 0, "other")


def test_a_failed_rank_is_named_and_the_run_is_crashed() -> None:
    out = merge_ranks([rank(0), rank(2)], world_size=3, failed=[1])
    assert out["run"]["status"] == "crashed"
    assert out["distributed"]["failed_ranks"] == [1]
    assert out["distributed"]["ranks_reported"] == 2
    assert summary_problems(out) == []


def test_many_ranks_stay_small() -> None:
    docs = [rank(r, shift(forward=0.01 * r)) for r in range(100)]
    out = merge_ranks(docs, world_size=100)
    dist = out["distributed"]
    assert len(dist["ranks"]) == MAX_RANKS_LISTED and dist["ranks_not_listed"] == 36
    assert dist["quantiles"]["own_work_ms"]["max"] >= dist["quantiles"]["own_work_ms"]["min"]
    assert summary_problems(out) == []


def test_nothing_to_merge_is_an_error() -> None:
    with pytest.raises(ValueError):
        merge_ranks([], world_size=2)


def test_a_large_fraction_of_a_sliver_of_the_step_is_not_a_straggler() -> None:
    """Own work 0.5 ms of a 20 ms step: +40 % of it is 1 % of the step, scheduling noise."""
    tiny = {"dataloader": 0.1, "forward": 0.2, "backward": 19.4, "optimizer": 0.1, "other": 0.1}
    slower = dict(tiny, forward=0.4)
    out = merge_ranks([rank(0, tiny), rank(1, slower)], world_size=2)
    s = out["distributed"]["straggler"]
    assert s["score_pct"] > 15 and s["label"] == BALANCED


def test_fsdp_ranks_are_not_labelled() -> None:
    """Under FSDP the collectives wait inside forward: own work is not a rank's own."""
    docs = [rank(0, shift(forward=6.0), parallelism="fsdp"), rank(1, parallelism="fsdp")]
    out = merge_ranks(docs, world_size=2)
    s = out["distributed"]["straggler"]
    assert s["label"] is None and "FSDP" in s["not_analysed"]
    assert not any(d["area"] == "distributed" for d in out["diagnoses"])
    assert summary_problems(out) == []


def test_a_rank_slowed_by_cpu_contention_is_balanced_with_a_note() -> None:
    """A loaded runner stretches one rank's compute: within what its measured runqueue wait
    can cause, no straggler (as the gate's contention guard for shares); beyond it, still one."""
    contention = {
        "runqueue_wait_pct": 40.0,
        "involuntary_switches_per_s": 50.0,
        "load_per_cpu": 2.0,
        "cpu_steal_pct": 0.0,
    }
    docs = [rank(0, shift(forward=4.0), contention=contention), rank(1, shift(backward=4.0))]
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert s["label"] == BALANCED and "contention" in s["contended"]
    docs = [rank(0, shift(forward=30.0), contention=contention), rank(1, shift(backward=30.0))]
    assert merge_ranks(docs, world_size=2)["distributed"]["straggler"]["label"] == (
        COMPUTE_STRAGGLER
    )


def test_a_wait_every_rank_has_does_not_excuse_a_straggler() -> None:
    """Two ranks on a loaded host both wait ~50 % of their wall time (measured: two DDP ranks
    beside two busy loops on 2 cores); the wait they share cannot explain why one computes
    longer. Judged against the other ranks, rank 0 is the straggler; with only rank 0 waiting
    more, the same excess is excused."""

    def contention(wait: float) -> dict[str, float]:
        return {
            "runqueue_wait_pct": wait,
            "involuntary_switches_per_s": 50.0,
            "load_per_cpu": 2.0,
            "cpu_steal_pct": 0.0,
        }

    docs = [
        rank(0, shift(forward=4.0), contention=contention(52.0)),
        rank(1, shift(backward=4.0), contention=contention(58.0)),
    ]
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == (COMPUTE_STRAGGLER, 0, "forward")
    assert "contended" not in s
    docs = [
        rank(0, shift(forward=4.0), contention=contention(52.0)),
        rank(1, shift(backward=4.0), contention=contention(2.0)),
    ]
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert s["label"] == BALANCED and "50 % more runqueue wait" in s["contended"]


# -- the wait phase: stragglers from evidence -------------------------------------------------


def waited(r: int, ms: dict[str, float], wait: float, **extra: Any) -> dict[str, Any]:
    """A rank traced with the wait phase: ``ms`` its own work per phase (backward = compute),
    ``wait`` ms per step waiting in collectives."""
    doc = rank(r, ms, **extra)
    st = doc["step_time"]
    step = sum(ms.values()) + wait
    phases = ("dataloader", "forward", "backward", "wait", "optimizer", "other")
    full = {**ms, "wait": wait}
    for p in phases:
        st[f"{p}_pct"] = round(100.0 * full[p] / step, 2)
        st["phase_ms"][p] = full[p]
        st["noise"]["pct"][p] = {"median": st[f"{p}_pct"], "iqr": 0.3}
    st["other_pct"] = round(100.0 - sum(st[f"{p}_pct"] for p in phases[:-1]), 2)
    st["step_ms"] = {"median": step, "p10": step * 0.95, "p90": step * 1.05, "mean": step}
    return doc


@pytest.mark.parametrize(
    ("phase", "label"),
    [
        ("dataloader", INPUT_STRAGGLER),
        ("forward", COMPUTE_STRAGGLER),
        ("backward", COMPUTE_STRAGGLER),
        ("optimizer", STRAGGLER),
    ],
)
def test_the_rank_the_others_wait_for_is_named_with_the_phase_it_is_late_in(
    phase: str, label: str
) -> None:
    # Rank 2 does 6 ms more in one phase; the other three wait ~6 ms for it each step.
    docs = [waited(r, shift(), 6.2 - 0.1 * r) for r in (0, 1, 3)]
    docs.insert(2, waited(2, shift(**{phase: 6.0}), 0.3))
    out = merge_ranks(docs, world_size=4)
    s = out["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"], s["evidence"]) == (label, 2, phase, "wait")
    assert s["lateness_ms"] == pytest.approx(6.2 - 0.1 - 0.3, abs=0.01)
    assert out["distributed"]["headline_rank"] == 2
    assert out["step_time"] == docs[2]["step_time"]  # the job's split: the straggler's
    diag = next(d for d in out["diagnoses"] if d["area"] == "distributed")
    assert phase in diag["message"] and "wait" in diag["message"]
    assert phase in diag["next_step"] or label != COMPUTE_STRAGGLER
    assert summary_problems(out) == []


def test_a_slow_backward_is_seen_only_with_the_wait_phase() -> None:
    """Without the wait phase a rank slow in backward hides: the others' all-reduce wait sits
    in their backward, so backward is not own work. With it, backward's compute is."""
    old = [rank(0, shift(backward=6.0)), rank(1, shift(backward=6.0))]
    assert merge_ranks(old, world_size=2)["distributed"]["straggler"]["label"] == BALANCED
    new = [waited(0, shift(), 6.0), waited(1, shift(backward=6.0), 0.2)]
    s = merge_ranks(new, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == (COMPUTE_STRAGGLER, 1, "backward")


def test_balanced_ranks_with_waits_have_no_label_and_a_real_rank_heads_the_summary() -> None:
    docs = [waited(r, shift(forward=0.1 * r), 1.0 + 0.2 * r) for r in range(3)]
    out = merge_ranks(docs, world_size=3)
    s = out["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["evidence"]) == (BALANCED, None, "wait")
    # No straggler: the critical path is still one rank's, the one that waited least.
    assert out["distributed"]["headline_rank"] == 0 and out["step_time"] == docs[0]["step_time"]
    assert summary_problems(out) == []


def test_more_own_work_that_nobody_waits_for_is_not_a_straggler() -> None:
    """A rank's own work is 6 ms above the others', yet they do not wait for it (the excess
    overlaps with their own, e.g. a slower loader that prefetches): the evidence says no."""
    docs = [waited(0, shift(), 1.0), waited(1, shift(dataloader=6.0), 1.1)]
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert s["label"] == BALANCED and s["lateness_ms"] < 2.0


def test_ranks_sharing_a_loaded_cpu_do_not_excuse_a_backward_straggler() -> None:
    def contention(wait: float) -> dict[str, float]:
        return {"runqueue_wait_pct": wait, "involuntary_switches_per_s": 50.0,
                "load_per_cpu": 2.0, "cpu_steal_pct": 0.0}

    docs = [waited(0, shift(), 6.0, contention=contention(30.0)),
            waited(1, shift(backward=6.0), 0.2, contention=contention(31.0))]
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"]) == (COMPUTE_STRAGGLER, 1) and "contended" not in s
    # Only rank 1 waited for a CPU that much more: its excess is within what that can cause.
    docs[0]["run"]["contention"] = contention(2.0)
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert s["label"] == BALANCED and "contention" in s["contended"]


def _thread(doc: dict[str, Any], cpu_wait_ms: float) -> dict[str, Any]:
    """``doc`` whose training thread waited ``cpu_wait_ms`` a step for a CPU (its analysed
    steps' split: on a CPU, waiting for one, blocked)."""
    step = doc["step_time"]["step_ms"]["median"]
    doc["step_time"]["thread"] = {"on_cpu_ms": step / 2, "cpu_wait_ms": cpu_wait_ms,
                                  "blocked_ms": step / 2 - cpu_wait_ms}
    return doc


def test_what_a_rank_waited_for_a_cpu_in_its_steps_is_taken_off_its_excess() -> None:
    """Measured beside three busy loops on 2 vCPUs, balanced FSDP ranks: one rank's own work
    was 3.3 ms (+63 %) over the other's and the other waited 2.2 ms a step for it, while its
    thread waited 2.2 ms a step more for a CPU in those steps -- and only 3.6 points more of
    its whole process's wall time, which the run-wide rule cannot excuse. What is left of the
    excess after that wait must still straggle."""

    def contention(wait: float) -> dict[str, float]:
        return {"runqueue_wait_pct": wait, "involuntary_switches_per_s": 50.0,
                "load_per_cpu": 2.0, "cpu_steal_pct": 0.0}

    def job(extra_cpu_wait_ms: float) -> list[dict[str, Any]]:
        return [
            _thread(waited(0, shift(), 6.0, contention=contention(21.0)), 1.8),
            _thread(waited(1, shift(backward=6.0), 0.2, contention=contention(24.6)),
                    1.8 + extra_cpu_wait_ms),
        ]

    # 6 ms extra, 4.5 of them waiting for a CPU: 1.5 ms left, under the 2 ms floor.
    out = merge_ranks(job(4.5), world_size=2)
    s = out["distributed"]["straggler"]
    assert (s["label"], s["rank"]) == (BALANCED, None), s
    assert "4.5 ms per step more" in s["contended"] and "leaves 1.5 ms" in s["contended"]
    assert [r["cpu_wait_ms"] for r in out["distributed"]["ranks"]] == pytest.approx([1.8, 6.3])
    assert summary_problems(out) == []
    # 1 ms of it waiting for a CPU: 5 ms left (+25 % of the other's own work) still straggles.
    s = merge_ranks(job(1.0), world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == (COMPUTE_STRAGGLER, 1, "backward")
    assert "contended" not in s
    # It waited less than the other: nothing is taken off, nor added.
    s = merge_ranks(job(-1.0), world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"]) == (COMPUTE_STRAGGLER, 1) and "contended" not in s
    # Where only the straggler measured its steps' wait, the run-wide rule decides: its
    # 3.6 points more runqueue wait excuse nothing; 35 points more would.
    docs = job(4.5)
    del docs[0]["step_time"]["thread"]
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"]) == (COMPUTE_STRAGGLER, 1) and "contended" not in s
    docs[1]["run"]["contention"] = contention(56.0)
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert s["label"] == BALANCED and "runqueue wait" in s["contended"]
    # With its steps' wait measured, 35 points more over the process's life (its startup
    # included) excuse nothing its steps did not wait.
    docs = job(0.2)
    docs[1]["run"]["contention"] = contention(56.0)
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"]) == (COMPUTE_STRAGGLER, 1) and "contended" not in s


def test_summaries_without_the_wait_phase_still_merge_as_before() -> None:
    docs = [rank(0, shift(backward=6.0)), rank(1, shift(dataloader=6.0))]
    s = merge_ranks(docs, world_size=2)["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["evidence"]) == (INPUT_STRAGGLER, 1, "own_work")
    assert "lateness_ms" not in s
