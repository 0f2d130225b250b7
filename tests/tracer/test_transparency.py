"""A traced model still pickles, deep-copies, saves and scripts as it did untraced.

Tracing attaches callables of ours to the user's modules (zero-change root hooks, sampled module
hooks, the per-step forward shadow). None of them may travel with the module: a saved model
must load where traceml-ci is not installed, and a copy must run its own forward."""

from __future__ import annotations

import copy
import gc
import io
import json
import pickle
import pickletools
import sys
import time
import weakref
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.cli.scripts import run_group
from tests.tracer.conftest import finish_and_load
from tests.tracer.fakes import FakeClock
from traceml_ci.tracer import api
from traceml_ci.tracer.transparency import hide, ours, restore, without_ours

SAVE_SCRIPT = """
import copy, sys, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 10 == 9:
        torch.save(model, sys.argv[1])           # a checkpoint, mid-run, hooks in place
        ema = copy.deepcopy(model)               # EMA-style copy
        torch.save(ema.state_dict(), sys.argv[1] + ".ema")
print("saved", flush=True)
"""


def _globals_in_pickle(data: bytes) -> set[str]:
    """Every module a pickle names (GLOBAL / STACK_GLOBAL operands): what loading it imports."""
    names: set[str] = set()
    recent: list[str] = []
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            recent.append(str(arg))
        elif op.name == "STACK_GLOBAL" and len(recent) >= 2:
            names.add(recent[-2])
        elif op.name == "GLOBAL":
            names.add(str(arg).split(" ")[0])
    return names


def _saved_modules(saved: Path | io.BytesIO) -> set[str]:
    """The modules a ``torch.save`` file's pickle names."""
    with zipfile.ZipFile(saved) as zf:
        (pkl,) = [n for n in zf.namelist() if n.endswith("data.pkl")]
        return _globals_in_pickle(zf.read(pkl))


def test_torch_save_of_the_model_under_traceml_ci_run_works_and_loads_without_us(tmp_path) -> None:
    """The reported case: zero-change mode made ``torch.save(model)`` raise (our root hooks)."""
    script = tmp_path / "train_and_save.py"
    script.write_text(SAVE_SCRIPT)
    ckpt = tmp_path / "model.pt"
    cmd = [
        sys.executable,
        "-m",
        "traceml_ci",
        "run",
        "--out",
        str(tmp_path / "out"),
        str(script),
        str(ckpt),
    ]
    proc = run_group(cmd, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "saved" in proc.stdout
    assert "warning" not in proc.stderr
    doc = json.loads((tmp_path / "out" / "final_summary.json").read_text())
    assert doc["run"]["mode"] == "zero-change"
    # The checkpoint names torch and builtins only: it loads wherever torch does.
    assert not any(m.startswith("traceml_ci") for m in _saved_modules(ckpt))
    model = torch.load(ckpt, weights_only=False)
    assert not any(ours(h) for h in model._forward_hooks.values())
    assert not model._forward_pre_hooks and not model._forward_hooks_always_called
    assert model(torch.randn(2, 8)).shape == (2, 1)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, each=None) -> None:
    for i in range(steps):
        with api.trace_step(model):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if each is not None:
                each(i)


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def test_zero_change_roots_pickle_deepcopy_and_script(fresh_tracer) -> None:
    tracer = fresh_tracer(zero_change=True, warmup_steps=0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    assert any(ours(h) for h in model._forward_pre_hooks.values())  # our roots are hooked

    clone = pickle.loads(pickle.dumps(model))
    assert not clone._forward_pre_hooks and not clone._forward_hooks
    assert not clone._forward_hooks_always_called
    twin = copy.deepcopy(model)
    assert not twin._forward_pre_hooks and not twin._forward_hooks
    scripted = torch.jit.script(model)  # our hooks' source is not TorchScript
    x = torch.randn(3, 8)
    assert torch.equal(scripted(x), model(x))
    # ...and the original keeps its hooks, in order: tracing goes on.
    assert any(ours(h) for h in model._forward_pre_hooks.values())
    for _ in range(3):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    doc = finish_and_load(tracer)
    assert doc["step_time"]["steps_total"] == 6
    assert doc["step_time"]["forward_pct"] > 0  # the roots' forward is still timed
    # Untraced again: torch's own __getstate__ and jit.script are back.
    assert nn.Module.__getstate__.__module__.startswith("torch")
    assert torch.jit.script.__module__.startswith("torch")


@pytest.mark.parametrize("zero_change", [False, True], ids=["trace_step", "zero-change"])
def test_a_model_the_user_drops_is_freed_while_tracing_goes_on(
    fresh_tracer, fake_waits, zero_change
) -> None:
    """A sweep trains one model after another in one process. The tracer held the first for
    good -- the module sampler the model it samples, zero-change discovery the roots it found
    -- so its weights and gradients (on a GPU, the next trial's memory) outlived the trial.
    (Zero-change tracing follows the first trial's model only: its steps are the 8 counted.)"""
    clock = FakeClock()
    tracer = fresh_tracer(zero_change=zero_change, warmup_steps=2, module_sample_s=0.01,
                          clock=clock)

    def trial() -> weakref.ref:
        model = _mlp()
        for layer in model:  # each layer's forward takes 1 ms of the fake clock
            layer.register_forward_pre_hook(lambda *_: clock.advance(1000))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        if zero_change:
            for _ in range(8):
                model(torch.randn(4, 8)).pow(2).mean().backward()
                opt.step()
        else:  # steps of 10 ms: a sample is due every 10 ms, at most one step in a few
            _train(model, opt, 8, each=lambda i: clock.advance(10_000))
        return weakref.ref(model)

    first = trial()
    second = trial()
    gc.collect()
    assert first() is None
    doc = finish_and_load(tracer)
    if zero_change:
        assert second() is None
    else:  # the step scope kept for the next trace_step holds the last model it named
        assert doc["step_time"]["steps_total"] == 16
        assert doc["modules"]["sampled_steps"] >= 1  # the first model, while it lived


def test_a_copy_made_inside_trace_step_runs_its_own_forward(fresh_tracer) -> None:
    """Inside the step the model's forward is shadowed by our timed wrapper; a deep copy that
    kept it would run the *original* model (silently wrong EMA)."""
    fresh_tracer(warmup_steps=0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    copies: list[nn.Module] = []
    pickled: list[bytes] = []

    def each(i: int) -> None:
        assert "forward" in model.__dict__  # the shadow is there while the step runs
        copies.append(copy.deepcopy(model))
        pickled.append(pickle.dumps(model))

    _train(model, opt, 3, each)
    twin = copies[-1]
    assert "forward" not in twin.__dict__
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    x = torch.randn(2, 8)
    assert torch.equal(twin(x), torch.zeros(2, 1))  # its own (zeroed) weights, not model's
    assert not torch.equal(model(x), torch.zeros(2, 1))
    clone = pickle.loads(pickled[-1])
    assert "forward" not in clone.__dict__
    assert clone(x).shape == (2, 1)


#: What ``_save_on_forward`` saw, per forward: whether our sampled hooks were on, and whether
#: only the model's own were (the unhooked-forward check after a sample: tracer/modules.py).
_SEEN_HOOKS: list[bool] = []
_SEEN_ROOT_ONLY: list[bool] = []


def _save_on_forward(model: nn.Module, args: object) -> None:
    """A user's forward pre-hook that saves the model (module-level: a user's hook must pickle
    too). Runs where a sampled step's hooks are all in place, and where only the model's are."""
    hooked = [any(ours(h) for h in m._forward_hooks.values()) for m in model.modules()]
    _SEEN_HOOKS.append(any(hooked))
    _SEEN_ROOT_ONLY.append(hooked[0] and not any(hooked[1:]))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    assert not any(n.startswith("traceml_ci") for n in _saved_modules(buf))


def test_sampled_module_hooks_stay_out_of_a_pickle(fresh_tracer) -> None:
    """Module sampling arms hooks on submodules for one step; a save meanwhile is clean."""
    fresh_tracer(warmup_steps=0, module_sample_s=0.01)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _SEEN_HOOKS.clear()
    _SEEN_ROOT_ONLY.clear()
    model.register_forward_pre_hook(_save_on_forward)
    _train(model, opt, 60, lambda i: time.sleep(0.003))  # steps long enough for 10 ms ticks
    assert any(_SEEN_HOOKS), "no sampled step: the test did not exercise the sampler's hooks"
    assert any(_SEEN_ROOT_ONLY), "no unhooked-forward check ran: its hooks went unexercised"


def test_without_ours_keeps_user_hooks_in_order_and_shares_untouched_tables() -> None:
    model = nn.Linear(2, 2)
    calls: list[str] = []
    model.register_forward_pre_hook(lambda m, a: calls.append("user-a"))
    mine = api.__dict__["trace_step"]  # any function defined in traceml_ci is "ours"
    model.register_forward_pre_hook(mine)
    model.register_forward_hook(mine, always_call=True)
    model.register_forward_pre_hook(lambda m, a: calls.append("user-b"))
    state = model.__getstate__()
    clean = without_ours(state)
    assert list(clean["_forward_pre_hooks"].values())[0] is not mine
    assert len(clean["_forward_pre_hooks"]) == 2
    assert clean["_forward_hooks"] == {} and clean["_forward_hooks_always_called"] == {}
    assert clean["_parameters"] is state["_parameters"]
    assert clean["_backward_hooks"] is state["_backward_hooks"]
    # hide/restore: the same dict objects, the same order.
    table = model._forward_pre_hooks
    order = list(table)
    saved = hide(model)
    assert len(table) == 2
    restore(saved)
    assert model._forward_pre_hooks is table and list(table) == order


@pytest.mark.parametrize("mode", ["auto", "manual"])
def test_untraced_and_traced_models_pickle_alike(fresh_tracer, mode) -> None:
    fresh_tracer(mode=mode, warmup_steps=0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _train(model, opt, 3)
    assert sorted(pickle.loads(pickle.dumps(model)).__dict__) == sorted(
        pickle.loads(pickle.dumps(_mlp())).__dict__
    )
