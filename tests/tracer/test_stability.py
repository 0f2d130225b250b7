"""The same job run 10 times gets the same step-time diagnosis at least 9 times.

On the real clock on purpose: what this guards is run-to-run noise (preemption, cold caches,
the tracer's own work between steps) pushing a share across a threshold, which a fake clock
does not have -- there every run is the same to the nanosecond and the check could not fail.
Which label a given split gets is tested on exact shares (tests/summary, and the fake-clock
loops here)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load
from tests.tracer.loops import BusyModel, BusySGD, busy_loader, train


@pytest.mark.parametrize(
    ("costs", "expected"),
    [
        ((3.0, 0.5, 0.5, 0.2), "INPUT_BOUND"),
        ((0.1, 1.5, 2.0, 0.2), "COMPUTE_BOUND"),
        ((0.2, 0.4, 0.4, 2.0), "OPTIMIZER_BOUND"),
    ],
)
def test_diagnosis_is_stable_over_ten_runs(fresh_tracer, costs, expected) -> None:
    dl_ms, fwd_ms, bwd_ms, opt_ms = costs
    labels = Counter()
    for _ in range(10):
        tracer = fresh_tracer(warmup_steps=3)
        model = BusyModel(fwd_ms, bwd_ms)
        optimizer = BusySGD(model.parameters(), opt_ms) if opt_ms else None
        optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.01)
        # 50 steps: enough that a few preempted ones (CPU hogs beside the suite) cannot move a
        # share across a threshold.
        train(busy_loader(50, dl_ms), model, optimizer, traceml.trace_step, 50)
        labels[finish_and_load(tracer)["step_time"]["diagnosis"]] += 1
    assert labels[expected] >= 9, labels
