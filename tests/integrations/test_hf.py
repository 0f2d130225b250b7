"""The Hugging Face Trainer callback, against a real Trainer with a tiny model built from config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import busy
from tests.integrations.conftest import load_summary, one_thread_no_tracer
from tests.integrations.spin import (
    SpinDataset,
    Stopwatch,
    assert_one_step_per_optimizer_step,
    assert_shares_match,
    now,
    spin_backward,
    spin_optimizer,
    timed,
    timed_collate,
)
from traceml_ci.summary.io import summary_text

pytestmark = pytest.mark.integration

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

BATCH, ACCUM, STEPS, WARMUP = 4, 4, 20, 5
# Known costs (ms): per item, per micro-batch forward and backward, per optimizer step.
ITEM_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS = 0.6, 1.5, 1.5, 8.0


def cpu_args(tmp_path: Path, **given: Any) -> Any:
    """A Trainer's arguments for these tests: one CPU process, quiet, nothing saved; ``given``
    is what a test is about (steps, accumulation, evaluation)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=BATCH, use_cpu=True,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=0, **given,
    )


def tiny_bert(watch: Stopwatch) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    class SpinBert(BertForSequenceClassification):
        # An explicit signature: the Trainer keeps only the columns forward() names.
        def forward(self, input_ids=None, attention_mask=None, labels=None):  # type: ignore[override]
            t0 = now()
            busy(FORWARD_MS)
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            out["loss"] = spin_backward(out["loss"], BACKWARD_MS)
            watch.add("forward", t0, now())
            return out

    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    torch.manual_seed(0)
    return SpinBert(config)


def item(i: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return {
        "input_ids": torch.randint(0, 64, (16,), generator=g),
        "attention_mask": torch.ones(16, dtype=torch.long),
        "labels": torch.tensor(i % 2),
    }


@pytest.fixture(scope="module")
def accumulated_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Stopwatch]:
    """One real Trainer run, gradient_accumulation_steps=4, with the callback: its summary and
    the stopwatch of the same run."""
    from transformers import Trainer, default_data_collator

    from traceml_ci.integrations.hf import TraceMLCallback

    tmp_path = tmp_path_factory.mktemp("hf")
    watch = Stopwatch()
    model = tiny_bert(watch)
    optimizer = spin_optimizer(torch.optim.AdamW, OPTIMIZER_MS, watch)(model.parameters(), lr=1e-3)
    args = cpu_args(tmp_path, gradient_accumulation_steps=ACCUM, max_steps=STEPS)
    out = tmp_path / "out"
    with one_thread_no_tracer():
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=SpinDataset(STEPS * ACCUM * BATCH, ITEM_MS, item, watch),
            data_collator=timed_collate(default_data_collator, watch),
            optimizers=(optimizer, None),
            callbacks=[TraceMLCallback(out_dir=out, warmup_steps=WARMUP, run_name="hf-accum")],
        )
        # The stopwatch's backward: the whole call the Trainer makes to run it.
        trainer.accelerator.backward = timed(trainer.accelerator.backward, "backward", watch)
        trainer.train()
        doc = load_summary(out)  # written at train end, not at exit
    return doc, watch


def test_one_step_per_optimizer_step(accumulated_run: tuple[dict, Stopwatch]) -> None:
    doc, watch = accumulated_run
    assert_one_step_per_optimizer_step(doc, watch, STEPS, WARMUP, "hf-accum")
    assert len(watch.events["forward"]) == STEPS * ACCUM
    assert doc["run"]["mode"] == "auto"


def test_shares_within_2pp_of_a_stopwatch(accumulated_run: tuple[dict, Stopwatch]) -> None:
    doc, watch = accumulated_run
    assert_shares_match(doc, watch)


def test_samples_per_second_counts_every_micro_batch(
    accumulated_run: tuple[dict, Stopwatch],
) -> None:
    """Samples per optimizer step = the 4 micro-batches (issue 9, item 3: a tracer fix)."""
    doc, watch = accumulated_run
    true_samples_per_s = ACCUM * BATCH / watch.seconds_per_step(WARMUP)
    got = doc["step_time"]["throughput"]["samples_per_s"]
    assert got == pytest.approx(true_samples_per_s, rel=0.15)


def test_trainer_building_its_own_optimizer(tmp_path: Path) -> None:
    """The usual setup: the Trainer builds AdamW itself (after the callback started tracing)."""
    from transformers import Trainer, default_data_collator

    from traceml_ci.integrations.hf import TraceMLCallback

    watch = Stopwatch()
    args = cpu_args(tmp_path, max_steps=4)
    Trainer(
        model=tiny_bert(watch),
        args=args,
        train_dataset=SpinDataset(4 * BATCH, 0.0, item, watch),
        data_collator=default_data_collator,
        callbacks=[TraceMLCallback(out_dir=tmp_path / "out", warmup_steps=0)],
    ).train()
    st = load_summary(tmp_path / "out")["step_time"]
    assert st["steps_total"] == 4
    assert st["phase_ms"]["optimizer"] > 0
    assert st["phase_ms"]["forward"] >= FORWARD_MS


def test_the_trainers_model_is_sampled_by_module(tmp_path: Path, monkeypatch) -> None:
    """Module sampling through the callback on a real BertForSequenceClassification: whole
    levels of its tree (down to each encoder layer's attention / intermediate / output), forward
    and backward through HF's ModelOutput, and shares that add up for siblings."""
    from transformers import Trainer, default_data_collator

    from traceml_ci.integrations.hf import TraceMLCallback
    from traceml_ci.tracer import api

    monkeypatch.setenv("TRACEML_CI_MODULE_SAMPLE_S", "0.001")
    model = tiny_bert(Stopwatch())
    args = cpu_args(tmp_path, gradient_accumulation_steps=2, max_steps=24)
    out = tmp_path / "out"
    api.stop()
    try:
        Trainer(
            model=model,
            args=args,
            train_dataset=SpinDataset(24 * 2 * BATCH, 0.0, item, Stopwatch()),
            data_collator=default_data_collator,
            callbacks=[TraceMLCallback(out_dir=out, warmup_steps=2)],
        ).train()
        doc = load_summary(out)
    finally:
        api.stop()
    mods = doc["modules"]
    assert mods["sampled_steps"] >= 3 and mods["backward_steps"] >= 3, mods
    for phase in ("forward", "backward"):
        names = {m["name"] for m in mods[phase]}
        assert "bert" in names and "bert.encoder.layer.0" in names, (phase, names)
        layers = [
            m for m in mods[phase] if m["name"] in ("bert.encoder.layer.0", "bert.encoder.layer.1")
        ]
        assert all(m["type"] == "BertLayer" for m in layers)
        bert = next(m for m in mods[phase] if m["name"] == "bert")
        assert 0 < sum(m["share_pct"] for m in layers) <= bert["share_pct"] + 0.5


@pytest.mark.parametrize("accum", [1, 2])
def test_samples_per_step_is_batch_times_accumulation_exactly(tmp_path: Path, accum: int) -> None:
    """The Trainer's loader (accelerate's DataLoaderShard) fetches one batch ahead: each epoch's
    last step fetches nothing and its first one an extra batch. Two whole epochs, so the run
    ends on such a step: every step still trains on batch x accumulation samples (issue 20:
    7.855 for 8 -- the last step's batch, fetched the step before, was counted nowhere)."""
    from transformers import Trainer, default_data_collator

    from traceml_ci.integrations.hf import TraceMLCallback

    steps_per_epoch = 6
    args = cpu_args(tmp_path, gradient_accumulation_steps=accum, num_train_epochs=2)
    Trainer(
        model=tiny_bert(Stopwatch()),
        args=args,
        train_dataset=SpinDataset(steps_per_epoch * accum * BATCH, 0.0, item, Stopwatch()),
        data_collator=default_data_collator,
        callbacks=[TraceMLCallback(out_dir=tmp_path / "out", warmup_steps=2)],
    ).train()
    st = load_summary(tmp_path / "out")["step_time"]
    assert st["steps_total"] == 2 * steps_per_epoch
    assert st["throughput"]["samples_per_step"] == BATCH * accum


def test_periodic_evaluation_is_its_own_figure_not_training_time(tmp_path: Path) -> None:
    """Issue 20: eval_strategy="steps" -- the evaluations' time is between steps and reported
    as evaluation (on_evaluate), and samples/s is the training steps' alone."""
    from transformers import Trainer, default_data_collator

    from traceml_ci.integrations.hf import TraceMLCallback

    eval_ms = 15.0  # per evaluation batch: each evaluation ~4 x 15 ms, a step ~ a few ms
    steps = 40

    class SpinEvalBert(type(tiny_bert(Stopwatch()))):  # type: ignore[misc]
        def forward(self, input_ids=None, attention_mask=None, labels=None):  # type: ignore[override]
            if not self.training:
                busy(eval_ms)
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels
            )

    torch.manual_seed(0)
    model = SpinEvalBert(tiny_bert(Stopwatch()).config)
    args = cpu_args(tmp_path, per_device_eval_batch_size=BATCH, max_steps=steps,
                    eval_strategy="steps", eval_steps=8)
    watch = Stopwatch()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=SpinDataset(steps * BATCH + BATCH, 0.0, item, watch),
        eval_dataset=SpinDataset(4 * BATCH, 0.0, item, watch),
        data_collator=default_data_collator,
        callbacks=[TraceMLCallback(out_dir=tmp_path / "out", warmup_steps=4)],
    )
    evals: list[float] = []
    spans: list[tuple[float, float]] = []
    evaluate = trainer.evaluate

    def timed_evaluate(*a, **kw):  # the Trainer's own evaluations, each timed whole
        t0 = now()
        try:
            return evaluate(*a, **kw)
        finally:
            evals.append(now() - t0)
            spans.append((t0, now()))

    trainer.evaluate = timed_evaluate
    ends: list[float] = []

    class StepEnds(transformers.TrainerCallback):
        def on_step_end(self, *a, **kw):  # type: ignore[no-untyped-def]
            ends.append(now())

    trainer.add_callback(StepEnds())
    trainer.train()
    st = load_summary(tmp_path / "out")["step_time"]
    b = st["between_steps"]
    assert len(evals) == steps // 8
    # Evaluations inside the measured span (after warmup, up to one of the last steps).
    assert 1 <= b["evals"] <= len(evals)
    # Each evaluation spins 4 batches x eval_ms in forward; the tracer's span (from the step's
    # end to on_evaluate) holds that much at least -- the stopwatch around evaluate() also holds
    # its set-up and logging, which a loaded machine stretches. One evaluation may be cut by an
    # edge of the measured span.
    assert b["eval_s"] >= (b["evals"] - 1) * 4 * eval_ms / 1e3
    assert b["eval_s"] <= 1.1 * sum(evals) + 0.01
    assert b["between_s"] >= b["eval_s"] and b["eval_pct"] <= b["between_pct"] <= 100
    assert b["eval_pct"] > 10  # ~60 ms per 8 steps of a few ms (quiet: ~35 %; loaded: ~20 %)
    # Training throughput from training steps only. Had the evaluations been in the steps,
    # samples/s would be samples over the wall time between step ends; without them it is over
    # that wall time less the evaluations (most of each stopwatch: it also holds set-up).
    tput = st["throughput"]
    assert tput["samples_per_step"] == BATCH
    wall = ends[-1] - ends[3]  # after the 4 warmup steps
    with_evals = BATCH * (len(ends) - 4) / wall
    # The evaluations inside that wall time only, like the tracer's figure (the last one runs
    # after the last step's end): with all of them taken off, a loaded run's leftover between
    # the steps (logging, callbacks) fell under the one evaluation too many, 402.7 < 409.5.
    inside = sum(min(b, ends[-1]) - max(a, ends[3]) for a, b in spans
                 if b > ends[3] and a < ends[-1])
    without = with_evals * wall / (wall - 0.8 * inside)
    assert tput["samples_per_s"] > without, (tput, with_evals, without, b)


# -- FLOPs by module on a tiny GPT-2 (issue 31) ----------------------------------------------------

GPT2_BATCH, GPT2_SEQ = 4, 32
GPT2_RUNS = {  # name -> (width, activation checkpointing: None, reentrant or not)
    "plain": (64, None), "wide": (128, None), "reentrant": (64, True), "non-reentrant": (64, False),
}


def _traced_gpt2(out: Path, width: int, reentrant: bool | None) -> dict[str, Any]:
    """A few traced SGD steps of a 2-layer GPT-2 built from its config (dropout p = 0, as a
    fine-tuning recipe sets it), with HF's gradient checkpointing when ``reentrant`` is given."""
    import warnings

    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    import traceml_ci as traceml
    from tests.tracer.conftest import finish_and_load
    from traceml_ci.tracer import api
    from traceml_ci.tracer.config import TracerConfig

    hf_logging.set_verbosity_error()  # the tiny vocabulary's token-id warnings
    config = GPT2Config(n_layer=2, n_embd=width, n_head=2, vocab_size=100,
                        n_positions=GPT2_SEQ, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.train()
    if reentrant is not None:
        with warnings.catch_warnings():  # renamed activation_checkpointing_enable in 5.x
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(0, 100, (GPT2_BATCH, GPT2_SEQ), generator=torch.Generator().manual_seed(0))
    tracer = api.start(TracerConfig(out_dir=out, warmup_steps=3, run_name="gpt2"), at_exit=False)
    try:
        for _ in range(5):
            with traceml.trace_step(model):
                loss = model(input_ids=ids, labels=ids).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return finish_and_load(tracer)
    finally:
        api.stop()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """name -> the summary of each GPT2_RUNS variant's traced steps."""
    from traceml_ci.tracer import flops

    root = tmp_path_factory.mktemp("gpt2")
    with one_thread_no_tracer(), pytest.MonkeyPatch.context() as mp:
        # Another test in this process may have compiled: count as a fresh process would.
        mp.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: False)
        return {name: _traced_gpt2(root / name, width, reentrant)
                for name, (width, reentrant) in GPT2_RUNS.items()}


def _matmul(n_in: int, n_out: int, times: int = 3, width: int = 64) -> int:
    """A projection's FLOPs on the batch's tokens: forward 2·tokens·in·out, and its weight's
    and its input's gradients as much again each (``times`` 3)."""
    return times * 2 * GPT2_BATCH * GPT2_SEQ * n_in * n_out


def test_gpt2s_flops_are_its_projections_not_its_dropouts(gpt2) -> None:
    """Issue 31: with dropout p = 0 torch's module tracker gave mlp.dropout and
    attn.resid_dropout the FLOPs of the projections whose backward ran while they stayed
    "entered". Each projection's are its own: the MLP's two, then the attention's c_attn."""
    e = 64
    flops = gpt2["plain"]["counters"]["flops"]
    assert flops["top_modules"] == [
        {"module": "transformer.h.0.mlp.c_fc", "type": "Conv1D", "flops": _matmul(e, 4 * e)},
        {"module": "transformer.h.0.mlp.c_proj", "type": "Conv1D", "flops": _matmul(4 * e, e)},
        {"module": "transformer.h.1.mlp.c_fc", "type": "Conv1D", "flops": _matmul(e, 4 * e)},
        {"module": "transformer.h.1.mlp.c_proj", "type": "Conv1D", "flops": _matmul(4 * e, e)},
        {"module": "transformer.h.0.attn.c_attn", "type": "Conv1D", "flops": _matmul(e, 3 * e)},
    ]
    assert "recomputed" not in flops


@pytest.mark.parametrize("run", ["reentrant", "non-reentrant"])
def test_gpt2s_checkpointed_layers_are_said_as_recomputed(gpt2, run: str) -> None:
    """HF's gradient checkpointing runs each layer's forward again in backward: said as the
    layers' recomputation, each module's own FLOPs as without it. Reentrant runs the whole
    layer again (12·e² per token: c_attn 3, c_proj 1, c_fc 4, mlp.c_proj 4); non-reentrant
    stops once backward has what it needs -- the MLP's c_proj output is saved by nothing."""
    e, plain, flops = 64, gpt2["plain"]["counters"]["flops"], gpt2[run]["counters"]["flops"]
    assert flops["top_modules"] == plain["top_modules"]
    per_layer = _matmul(e, e, times=1) * (12 if run == "reentrant" else 8)
    assert flops["recomputed"] == {
        "per_step": 2 * per_layer,
        "top_modules": [{"module": "transformer.h.0", "type": "GPT2Block", "flops": per_layer},
                        {"module": "transformer.h.1", "type": "GPT2Block", "flops": per_layer}],
    }
    assert flops["per_step"] == plain["per_step"] + 2 * per_layer
    # still a small block: ~2 KB, the ATen op kinds ~20 bytes each
    assert len(json.dumps(gpt2[run]["counters"])) < 3072
    assert len(summary_text(gpt2[run]).encode()) <= 8 * 1024  # the whole summary


def test_a_wider_gpt2_names_its_projections_as_the_cause(gpt2) -> None:
    """Issue 31's wider GPT-2: the cause named the Dropouts (``transformer.h.1.mlp.dropout
    Dropout +151 MFLOP``); it is the projections, each 4× wider (64 → 128)."""
    from traceml_ci.gate import fmt
    from traceml_ci.gate.compare import compare

    c = compare(gpt2["plain"], gpt2["wide"])
    base, head = (gpt2[run]["counters"]["flops"]["per_step"] for run in ("plain", "wide"))
    grown = fmt.flops(_matmul(128, 512) - _matmul(64, 256))  # c_fc; the MLP's c_proj alike
    assert c.row("counters.flops_per_step").cause == (
        f"FLOPs per step {100 * (head / base - 1):+.0f} % ("
        f"transformer.h.0.mlp.c_fc Conv1D +{grown}, transformer.h.0.mlp.c_proj Conv1D +{grown}, "
        f"transformer.h.1.mlp.c_fc Conv1D +{grown})"
    )
    assert "Dropout" not in " ".join(c.causes)


@pytest.mark.parametrize(("run", "per_token"), [("reentrant", 12), ("non-reentrant", 8)])
def test_gpt2_with_checkpointing_turned_on_names_the_recomputed_layers(
    gpt2, run: str, per_token: int
) -> None:
    """Issue 31: with gradient checkpointing on the cause named Dropouts and projections that
    had moved the wrong way (``transformer.h.1.mlp.c_proj Conv1D +21 MFLOP,
    transformer.h.1.mlp.dropout Dropout +16.8 MFLOP, transformer.h.0.mlp.c_fc Conv1D −12.6
    MFLOP``); it is the layers' forward, recomputed."""
    from traceml_ci.gate import fmt
    from traceml_ci.gate.compare import compare

    c = compare(gpt2["plain"], gpt2[run])
    base, head = (gpt2[r]["counters"]["flops"]["per_step"] for r in ("plain", run))
    layer = fmt.flops(per_token * _matmul(64, 64, times=1))
    assert c.row("counters.flops_per_step").cause == (
        f"FLOPs per step {100 * (head / base - 1):+.0f} % (recomputed forward under activation "
        f"checkpointing +{fmt.flops(head - base)}: transformer.h.0 GPT2Block +{layer}, "
        f"transformer.h.1 GPT2Block +{layer})"
    )
