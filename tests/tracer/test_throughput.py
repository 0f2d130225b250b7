"""Samples per step (gradient accumulation), the DataLoader's own settings and the input hints
built from them, and what manual mode says when it recorded nothing.

The loops here spend their phases' time on a fake clock (``fakes.FakeClock``): what is checked
is arithmetic -- samples summed over micro-batches, per second of step time -- so the truth is
exact and the machine's load cannot move it. Attribution against real time is
test_attribution.py's."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load
from tests.tracer.fakes import FakeClock
from tests.tracer.loops import BusyModel, BusySGD, busy_loader, one_ahead, spend_on
from traceml_ci.summary.diagnose import input_next_step
from traceml_ci.summary.model import DataLoaderSettings
from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS

MICRO = 4  # micro-batches per optimizer step
BATCH = 6
#: Fake milliseconds of each fetch, forward, backward and optimizer step.
FETCH_MS, FORWARD_MS, BACKWARD_MS, STEP_MS = 0.5, 0.25, 0.75, 0.5
#: One optimizer step of MICRO micro-batches: its time on the fake clock, exactly.
STEP_TOTAL_MS = MICRO * (FETCH_MS + FORWARD_MS + BACKWARD_MS) + STEP_MS


def _job(clock: FakeClock, batches: int) -> tuple[BusyModel, BusySGD, object]:
    spend = spend_on(clock)
    model = BusyModel(FORWARD_MS, BACKWARD_MS, spend=spend)
    optimizer = BusySGD(model.parameters(), step_ms=STEP_MS, spend=spend)
    return model, optimizer, iter(busy_loader(batches, FETCH_MS, batch_size=BATCH, spend=spend))


def _accumulation_steps(clock: FakeClock, steps: int) -> None:
    model, optimizer, batches = _job(clock, steps * MICRO)
    for _ in range(steps):
        with traceml.trace_step(model):
            for _ in range(MICRO):
                x, y = next(batches)  # fetched inside the step, one per micro-batch
                (((model(x) - y) ** 2).mean() / MICRO).backward()
            optimizer.step()
            optimizer.zero_grad()


def test_samples_per_step_sum_every_micro_batch(fresh_tracer) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=2, clock=clock)
    _accumulation_steps(clock, 16)
    st = finish_and_load(tracer)["step_time"]
    tput = st["throughput"]
    assert tput["batch_size"] == BATCH
    assert tput["samples_per_step"] == MICRO * BATCH  # not the first micro-batch only
    assert st["step_ms"]["median"] == STEP_TOTAL_MS
    assert st["phase_ms"] == {"dataloader": MICRO * FETCH_MS, "forward": MICRO * FORWARD_MS,
                              "backward": MICRO * BACKWARD_MS, "optimizer": STEP_MS,
                              "other": 0.0}
    assert tput["samples_per_s"] == pytest.approx(MICRO * BATCH / (STEP_TOTAL_MS / 1e3),
                                                  abs=1e-3)


def test_zero_change_samples_per_optimizer_step(fresh_tracer) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(zero_change=True, warmup_steps=2, clock=clock)
    model, optimizer, batches = _job(clock, 16 * MICRO)
    between_ms = 0.125  # after each optimizer step, before the next step's first fetch
    for _ in range(16):
        for _ in range(MICRO):
            x, y = next(batches)
            (((model(x) - y) ** 2).mean() / MICRO).backward()
        optimizer.step()
        optimizer.zero_grad()
        clock.advance(between_ms * 1000)
    doc = finish_and_load(tracer)
    st = doc["step_time"]
    assert st["steps_total"] == 16
    assert st["throughput"]["samples_per_step"] == MICRO * BATCH
    # A step runs from its first fetch to the next one's: the time between steps is its
    # "other" -- but the last step ends at its optimizer step.
    assert st["step_ms"]["median"] == STEP_TOTAL_MS + between_ms
    assert st["phase_ms"]["other"] == pytest.approx(between_ms, abs=1e-3)
    per_s = st["throughput"]["samples_per_s"]
    assert MICRO * BATCH / ((STEP_TOTAL_MS + between_ms) / 1e3) <= per_s + 1e-3
    assert per_s <= MICRO * BATCH / (STEP_TOTAL_MS / 1e3)


def test_batch_size_given_to_init_is_samples_per_step(fresh_tracer) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=2, batch_size=100, clock=clock)
    _accumulation_steps(clock, 12)
    tput = finish_and_load(tracer)["step_time"]["throughput"]
    assert tput["samples_per_step"] == 100
    assert tput["samples_per_s"] == pytest.approx(100 / (STEP_TOTAL_MS / 1e3), abs=1e-3)


def test_dataloader_settings_are_in_the_summary(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=2)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
    model = BusyModel(0.0, 0.0)
    for x, _ in loader:
        with traceml.trace_step(model):
            model(x)
    st = finish_and_load(tracer)["step_time"]
    assert st["dataloader"] == {
        "num_workers": 1,
        "pin_memory": False,
        "persistent_workers": True,
        "prefetch_factor": 2,
        "batch_size": 4,
        "device": "cpu",
        "collate_fn": "default",
    }
    assert st["throughput"]["samples_per_step"] == 4


def test_input_bound_hint_names_num_workers_zero_and_skips_pinning_on_cpu(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=2)
    model = BusyModel(0.2, 0.2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in busy_loader(16, 3.0):  # num_workers=0, slow batches
        with traceml.trace_step(model):
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
    doc = finish_and_load(tracer)
    assert doc["step_time"]["dataloader"]["num_workers"] == 0
    [hint] = [d["next_step"] for d in doc["diagnoses"] if d["kind"] == "INPUT_BOUND"]
    assert "num_workers=0" in hint
    assert "pin_memory" not in hint  # CPU-only run: pinned memory cannot help
    assert "persistent_workers" not in hint  # no workers to keep


def _settings(**changes: object) -> DataLoaderSettings:
    base = {
        "num_workers": 4,
        "pin_memory": False,
        "persistent_workers": False,
        "prefetch_factor": 2,
        "batch_size": 32,
        "device": "cuda",
    }
    base.update(changes)
    return DataLoaderSettings(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "device", "present", "absent"),
    [
        (_settings(), "cuda", ["num_workers=4", "persistent_workers=True", "pin_memory=True"], []),
        (_settings(persistent_workers=True), "cuda", ["pin_memory=True"], ["persistent_workers"]),
        (_settings(pin_memory=True), "cuda", ["persistent_workers=True"], ["pin_memory"]),
        (_settings(device="cpu"), "cpu", ["persistent_workers=True"], ["pin_memory"]),
        (
            _settings(num_workers=0, prefetch_factor=None),
            "cuda",
            ["num_workers=0", "pin_memory=True"],
            ["persistent_workers"],
        ),
        (None, "cpu", ["num_workers", "persistent_workers=True"], ["pin_memory"]),
        (None, "cuda", ["pin_memory=True"], []),
    ],
)
def test_input_hint_variants(settings, device, present, absent) -> None:
    hint = input_next_step(settings, device)
    for text in present:
        assert text in hint
    for text in absent:
        assert text not in hint


def test_hint_reaches_the_diagnosis() -> None:
    from traceml_ci.summary.diagnose import diagnose_step_time

    pct = {"dataloader": 60.0, "forward": 10.0, "backward": 10.0, "optimizer": 10.0, "other": 10.0}
    [first, *_] = diagnose_step_time(
        pct, 50, 5, DEFAULT_THRESHOLDS, dataloader=_settings(num_workers=0), device="cpu"
    )
    assert first.kind == "INPUT_BOUND" and "num_workers=0" in first.next_step
    assert "pin_memory" not in first.next_step


def test_manual_mode_without_steps_warns_once_and_says_manual(fresh_tracer, capfd) -> None:
    tracer = fresh_tracer(mode="manual", warmup_steps=0)
    model = BusyModel(0.1, 0.1)
    for x, _ in traceml.wrap_dataloader(busy_loader(4, 0.1)):
        with traceml.phase("forward"):
            model(x)  # phases marked, but the loop body is never wrapped in trace_step
    doc = finish_and_load(tracer)
    tracer.finish()  # a second finish (e.g. at exit) does not warn again
    err = capfd.readouterr().err
    assert err.count("manual mode recorded no steps: wrap the loop body in trace_step") == 1
    assert doc["run"]["mode"] == "manual"
    assert doc["step_time"]["steps_total"] == 0


def test_manual_mode_asked_by_a_launched_script_is_reported_as_manual(fresh_tracer) -> None:
    """Under ``traceml-ci run`` (zero-change) a script's init(mode="manual") is what it asked."""
    tracer = fresh_tracer(zero_change=True, warmup_steps=0)
    traceml.init(mode="manual")
    model = BusyModel(0.1, 0.1)
    for x, _ in traceml.wrap_dataloader(busy_loader(4, 0.1)):
        model(x)
    doc = finish_and_load(tracer)
    assert doc["run"]["mode"] == "manual"


def test_auto_mode_with_steps_is_not_warned(fresh_tracer, capfd) -> None:
    tracer = fresh_tracer(warmup_steps=0)
    with traceml.trace_step():
        pass
    assert finish_and_load(tracer)["run"]["mode"] == "auto"
    assert "recorded no steps" not in capfd.readouterr().err


@pytest.mark.parametrize("micro", [1, 2])
@pytest.mark.parametrize("epochs,extra", [(2, 0), (1, 3)])
def test_a_loader_fetching_one_batch_ahead_counts_every_batch_once(
    fresh_tracer, micro: int, epochs: int, extra: int
) -> None:
    """Issue 20: with a one-ahead loader, each epoch's last step fetches one batch less (its
    batch came the step before) and the first one more. Ending on an epoch's end (extra=0) or
    not (extra batches left), with an evaluation loop between steps, samples per step is
    exactly micro x batch."""
    tracer = fresh_tracer(warmup_steps=2)
    model = BusyModel(0.0, 0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 6
    train = busy_loader(steps * micro + extra, 0.0, batch_size=BATCH)
    val = busy_loader(3, 0.0, batch_size=5)
    done = 0
    for _ in range(epochs):
        batches = one_ahead(train)
        for _ in range(steps):
            group = [next(batches) for _ in range(micro)]  # the Trainer's get_batch_samples
            with traceml.trace_step(model):
                for x, y in group:
                    ((model(x) - y) ** 2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            done += 1
            if done % 4 == 0:
                with torch.no_grad():
                    for vx, _ in one_ahead(val):
                        model(vx)
    st = finish_and_load(tracer)["step_time"]
    assert st["steps_total"] == epochs * steps
    assert st["throughput"]["samples_per_step"] == micro * BATCH


def test_time_between_steps_is_measured_and_kept_out_of_samples_per_s(fresh_tracer) -> None:
    """Issue 20: a loop's own evaluation between its trace_steps (nanoGPT's estimate_loss under
    no_grad) was nowhere. It is between_steps time now -- not told apart as evaluation (no hook
    says so) -- and samples/s stays the training steps' own. (Fake time: the window is the
    analysed steps' exactly, from the last warmup step's end to the last step's end.)"""
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=2, batch_size=BATCH, clock=clock)
    model = BusyModel(1.0, 1.0, spend=spend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, 8), torch.randn(BATCH, 1)
    for i in range(60):
        with traceml.trace_step(model):
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        if i % 10 == 5:  # 6 evaluations, all after the warmup: 4 forwards and 30 ms more
            with torch.no_grad():
                for _ in range(4):
                    model(x)
                spend(30.0)
    st = finish_and_load(tracer)["step_time"]
    b = st["between_steps"]
    assert b["eval_s"] is None and b["evals"] is None and b["eval_pct"] is None
    between_s = 6 * (4 * 1.0 + 30.0) / 1e3
    wall_s = 58 * 2.0 / 1e3 + between_s  # 58 analysed steps of 2 ms, and the evaluations
    assert (b["wall_s"], b["between_s"]) == (pytest.approx(wall_s), pytest.approx(between_s))
    assert b["between_pct"] == pytest.approx(100 * between_s / wall_s, abs=1e-3)
    # Samples/s of the steps alone (2 ms each), not of the wall time with the evaluations.
    assert st["throughput"]["samples_per_s"] == pytest.approx(BATCH / 2e-3, abs=1e-3)


def _nanogpt_loop(model, optimizer, x, y, teacher=None) -> tuple[list[float], float, float]:
    """nanoGPT's shape under zero-change mode: estimate_loss() every 10 iterations
    (model.eval(), no_grad, several forwards, model.train()), then a training step closed by
    optimizer.step(). Returns the evaluations' stopwatch, the wall time and the steps' time
    from the second window on."""
    evals: list[float] = []
    steps_s = 0.0
    start = None
    for i in range(60):
        if i == 10:
            start = time.perf_counter()
        if i % 10 == 5:
            t0 = time.perf_counter()
            model.eval()
            with torch.no_grad():
                for _ in range(4):
                    model(x)
                time.sleep(0.03)
                model(x)
            model.train()
            evals.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if teacher is not None:
            with torch.no_grad():
                teacher(x)
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if start is not None:
            steps_s += time.perf_counter() - t0
    return evals, time.perf_counter() - start, steps_s


def test_zero_change_evaluation_is_its_own_time_not_a_steps(fresh_tracer) -> None:
    """Issue 20: nanoGPT's eval (22 % of its wall time) vanished into the next step under
    traceml-ci run. A trained model run in eval mode without grad is evaluation: between
    steps, told apart as eval_s, out of the steps' time and samples/s."""
    tracer = fresh_tracer(zero_change=True, warmup_steps=2, batch_size=BATCH)
    model = BusyModel(1.0, 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, 8), torch.randn(BATCH, 1)
    evals, _, _ = _nanogpt_loop(model, optimizer, x, y)
    st = finish_and_load(tracer)["step_time"]
    b = st["between_steps"]
    assert b["evals"] == len(evals)  # one span per estimate_loss, not one per forward
    assert 0.6 * sum(evals[1:]) <= b["eval_s"] <= sum(evals) + 0.05
    assert b["eval_s"] <= b["between_s"] + 1e-9
    # The steps are training alone: each about a forward, a backward and a step of BusyModel.
    assert st["step_ms"]["median"] < 30  # an evaluation (>= 30 ms of sleep) is in none


def test_a_teacher_that_never_trains_stays_forward(fresh_tracer) -> None:
    """Distillation: a teacher in eval mode under no_grad inside each step is forward, not
    evaluation (it never ran a forward with grad)."""
    tracer = fresh_tracer(zero_change=True, warmup_steps=2)
    model, teacher = BusyModel(1.0, 1.0), BusyModel(2.0, 0.0).eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, 8), torch.randn(BATCH, 1)
    for _ in range(40):
        with torch.no_grad():
            teacher(x)
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    st = finish_and_load(tracer)["step_time"]
    assert (st["between_steps"] or {}).get("eval_s") is None  # (None: too short to measure)
    assert st["phase_ms"]["forward"] >= 2.5  # the teacher's 2 ms and the model's 1 ms
