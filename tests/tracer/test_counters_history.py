"""Counters of what a step keeps and does beyond its ops (tracer/counters.py), against analytic
truths: the autograd graph nodes a loop keeps alive across steps and the line that holds them,
a validation forward with autograd on, and DDP's all-reduces per optimizer step."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load, marked_line
from traceml_ci.tracer import counters

B, IN, HID, OUT = 4, 8, 16, 1
ACCUM = 4
HERE = os.path.relpath(__file__)
#: Graph nodes one micro-batch makes by outer torch calls: Linear, ReLU, Linear (three), the
#: loss, its division by ACCUM.
NODES_PER_MICRO = 5


@pytest.fixture(autouse=True)
def _no_compile_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    from traceml_ci.tracer import flops

    monkeypatch.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: False)


def _at(marker: str) -> str:
    return f"{HERE}:{marked_line(__file__, marker)}"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))


def _accumulate(model: nn.Module, steps: int = 10, *, keep_graph: bool = False,
                validate: str = "", no_sync: bool = False) -> list[torch.Tensor]:
    """Gradient accumulation over ACCUM micro-batches, a running total of the loss, and a
    per-step validation forward (``validate``: "" none, "no_grad", "grad")."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    total = torch.zeros(())
    val_losses: list[torch.Tensor] = []
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    for _ in range(steps):
        with traceml.trace_step(model):
            for micro in range(ACCUM):
                last = micro == ACCUM - 1
                with model.no_sync() if no_sync and not last else _nothing():
                    loss = F.mse_loss(model(x), y) / ACCUM  # marker:loss
                    loss.backward()  # marker:backward
                total = total + (loss if keep_graph else loss.detach())  # marker:total
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if validate:
                model.eval()
                with torch.no_grad() if validate == "no_grad" else _nothing():
                    val_losses.append(F.mse_loss(model(x), y))  # marker:val
                model.train()
    return val_losses


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_running_total_of_the_loss_keeps_each_steps_graph_alive(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _accumulate(_model(), keep_graph=True)
    graph = finish_and_load(tracer)["counters"]["graph"]
    # each micro-batch's graph, and the add that chains it to the total, alive 3 steps later
    assert graph == {
        "after_steps": counters.LEAK_AFTER_STEPS,
        "nodes_kept_per_step": ACCUM * (NODES_PER_MICRO + 1),
        "top": [{"at": _at("marker:loss"), "nodes": ACCUM * NODES_PER_MICRO},
                {"at": _at("marker:total"), "nodes": ACCUM}],
        "newest": {"op": "add", "at": _at("marker:total")},  # what holds the history
    }


def test_a_detached_total_keeps_nothing(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _accumulate(_model())
    c = finish_and_load(tracer)["counters"]
    # nothing to name: no sites (the summary stays small)
    assert c["graph"] == {"after_steps": counters.LEAK_AFTER_STEPS, "nodes_kept_per_step": 0}
    assert c["eval_grad"] == {"per_step": 0}
    assert c["collectives"] == {"per_step": 0, "bytes_per_step": 0}


def test_a_validation_forward_with_grad_is_counted_at_its_line(fresh_tracer, tmp_path) -> None:
    got = {}
    for validate in ("grad", "no_grad"):
        tracer = fresh_tracer(warmup_steps=5, out_dir=tmp_path / validate)
        kept = _accumulate(_model(), validate=validate)
        got[validate] = finish_and_load(tracer)["counters"]
        assert len(kept) == 10
    assert got["grad"]["eval_grad"] == {"per_step": 1,
                                        "sites": [{"at": _at("marker:val"), "count": 1}]}
    # the kept validation losses hold their graphs: the three layers and the loss
    assert got["grad"]["graph"]["nodes_kept_per_step"] == 4
    assert got["grad"]["graph"]["newest"] == {"op": "mse_loss", "at": _at("marker:val")}
    # the list that keeps them, named with the line that appends to it
    assert got["grad"]["graph"]["held_by"] == {"name": "val_losses", "at": _at("marker:val")}
    assert got["no_grad"]["eval_grad"]["per_step"] == 0
    assert got["no_grad"]["graph"]["nodes_kept_per_step"] == 0


def test_a_submodule_in_eval_mode_is_not_a_validation_forward(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    model = _model()
    model[0].eval()  # a frozen layer while the model trains: no news
    _accumulate(model)
    assert finish_and_load(tracer)["counters"]["eval_grad"]["per_step"] == 0


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("no_sync", [True, False])
def test_ddp_all_reduces_once_per_step_with_no_sync_else_per_micro_batch(
    fresh_tracer, tmp_path, no_sync
) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = DDP(_model())
        tracer = fresh_tracer(warmup_steps=5, out_dir=tmp_path / "out")
        _accumulate(model, no_sync=no_sync)
        got = finish_and_load(tracer)["counters"]["collectives"]
    finally:
        dist.destroy_process_group()
    reduces = 1 if no_sync else ACCUM
    # one bucket holds every gradient: each all-reduce sends all of them, from the backward
    [allreduce] = [s for s in got["sites"] if s["op"] == "allreduce_"]
    assert allreduce == {"op": "allreduce_", "at": _at("marker:backward"), "count": reduces,
                         "bytes": reduces * _param_bytes(model)}
    assert got["per_step"] == sum(s["count"] for s in got["sites"])
    assert got["bytes_per_step"] == sum(s["bytes"] for s in got["sites"])
    # (the forward that follows no_sync() broadcasts too: DDP's own, counted as it runs)
    assert {s["op"] for s in got["sites"]} <= {"allreduce_", "broadcast_"}


def test_the_probe_leaves_no_mode_and_no_hook_behind(fresh_tracer) -> None:
    from torch.overrides import _get_current_function_mode_stack

    tracer = fresh_tracer(warmup_steps=5)
    _accumulate(_model(), keep_graph=True, validate="grad")
    finish_and_load(tracer)
    assert _get_current_function_mode_stack() == []
    assert not torch.nn.modules.module._global_forward_pre_hooks


def _log_line(step: int, lr: float) -> str:  # marker:log-def
    return _fields(step) + f" lr={lr}"


def _fields(step: int) -> str:  # marker:fields-def
    return f"step={step}"


def _logging_loop(calls_per_step: int, steps: int = 10) -> list[str]:
    """A plain loop that calls ``_log_line`` (which calls ``_fields``) ``calls_per_step``
    times a step."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    lines = []
    for step in range(steps):
        with traceml.trace_step(model):
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            for _ in range(calls_per_step):
                lines.append(_log_line(step, 0.01))
    return lines


def test_python_calls_per_step_count_the_users_functions_exactly(fresh_tracer, tmp_path) -> None:
    import gc

    got = {}
    for n in (0, 3):
        tracer = fresh_tracer(warmup_steps=5, out_dir=tmp_path / str(n))
        _logging_loop(n)
        got[n] = finish_and_load(tracer)["counters"]["python"]
    assert gc.isenabled()  # paused for the counted step only
    assert got[0]["user"] == 0 and "top_user" not in got[0]
    assert got[3]["top_user"] == [
        {"at": _at("marker:log-def"), "function": "_log_line", "calls": 3},
        {"at": _at("marker:fields-def"), "function": "_fields", "calls": 3}]
    assert got[3]["user"] == 3 + 3
    assert got[3]["library"] == got[0]["library"]  # the step's torch calls, the same
    assert got[3]["per_step"] == got[3]["user"] + got[3]["library"]


def test_python_calls_are_the_same_on_every_run(fresh_tracer, tmp_path) -> None:
    runs = []
    for run in ("a", "b"):
        tracer = fresh_tracer(warmup_steps=5, out_dir=tmp_path / run)
        _logging_loop(2)
        runs.append(finish_and_load(tracer)["counters"]["python"])
    assert runs[0] == runs[1] and runs[0]["library"] > 0


def test_a_profiler_in_use_is_left_alone_and_nothing_is_counted(fresh_tracer) -> None:
    import sys

    from traceml_ci.tracer import pycalls

    def theirs(frame, event, arg):  # the user's own profiler
        return None

    tracer = fresh_tracer(warmup_steps=5)
    sys.setprofile(theirs)
    try:
        _logging_loop(1)
        assert sys.getprofile() is theirs
    finally:
        sys.setprofile(None)
    c = finish_and_load(tracer)["counters"]
    assert "python" not in c and tracer.counters.python.reason == pycalls.NOT_MEASURED_PROFILER


def test_allocations_and_ops_are_split_by_phase(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _accumulate(_model())
    c = finish_and_load(tracer)["counters"]
    allocs, ops = c["allocs"], c["ops"]
    # the forward's three new tensors per micro-batch: Linear's output, ReLU's, Linear's
    assert allocs["by_phase"]["forward"] == [ACCUM * 3, ACCUM * 4 * B * (HID + HID + OUT)]
    assert set(ops["by_phase"]) == {"forward", "backward", "optimizer", "other"}
    # SGD without momentum updates the parameters in place: ops, no new storage
    assert ops["by_phase"]["optimizer"] > 0 and "optimizer" not in allocs["by_phase"]
    assert allocs["per_step"] == sum(n for n, _ in allocs["by_phase"].values())
    assert allocs["bytes_per_step"] == sum(b for _, b in allocs["by_phase"].values())
    assert ops["per_step"] == sum(ops["by_phase"].values())


class _Trainer:
    """Keeps each step's output in an attribute: the holder is ``self.outputs``."""

    def __init__(self) -> None:
        self.model = _model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.outputs: list[torch.Tensor] = []

    def fit(self, steps: int = 10) -> None:
        x, y = torch.randn(B, IN), torch.randn(B, OUT)
        for _ in range(steps):
            with traceml.trace_step(self.model):
                out = self.model(x)
                F.mse_loss(out, y).backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.outputs.append(out)  # marker:self-append


def test_an_output_kept_in_an_attribute_is_held_by_self_dot_it(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _Trainer().fit()
    graph = finish_and_load(tracer)["counters"]["graph"]
    assert graph["nodes_kept_per_step"] == 3  # Linear, ReLU, Linear
    assert graph["held_by"] == {"name": "self.outputs", "at": _at("marker:self-append")}


SCRIPT = """
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for step in range(10):
    with traceml.trace_step(model):
        out = model(torch.randn(4, 8))
        out.sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        kept.append(out)
"""


def test_a_module_level_loop_keeps_its_globals_while_its_holder_is_found(fresh_tracer) -> None:
    """A script's loop runs in its module's frame, whose locals are its globals: they are read,
    never emptied (the loop goes on using them)."""
    tracer = fresh_tracer(warmup_steps=5)
    scope = {"nn": nn, "torch": torch, "traceml": traceml}
    exec(compile(SCRIPT, "<string>", "exec"), scope)  # noqa: S102 -- a user's script
    assert len(scope["kept"]) == 10 and "model" in scope
    graph = finish_and_load(tracer)["counters"]["graph"]
    assert graph["held_by"] == {"name": "kept", "at": "<string>:11"}


def test_host_to_device_copies_are_counted_by_line(fresh_tracer, monkeypatch) -> None:
    """No GPU here: the meta device stands in for one (the dispatcher sees the same
    ``_to_copy`` and ``copy_``)."""
    monkeypatch.setattr(counters, "HOST_DEVICES", ("cpu",))
    tracer = fresh_tracer(warmup_steps=5)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    staging = torch.empty(B, IN, device="meta")
    for _ in range(10):
        with traceml.trace_step(model):
            x.to("meta")  # marker:to-device
            staging.copy_(x)  # marker:copy-device
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    h2d = finish_and_load(tracer)["counters"]["h2d"]
    nbytes = B * IN * 4
    assert h2d == {"device": "cpu", "per_step": 2, "bytes_per_step": 2 * nbytes,
                   "unpinned_per_step": 2,  # no accelerator: nothing can be pinned
                   "sites": [{"at": _at("marker:to-device"), "count": 1, "bytes": nbytes},
                             {"at": _at("marker:copy-device"), "count": 1, "bytes": nbytes}]}


def test_a_cpu_run_makes_no_host_to_device_copy(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    _accumulate(_model())
    assert finish_and_load(tracer)["counters"]["h2d"] == {"device": "cpu", "per_step": 0}


def test_an_optimizer_stepped_by_a_grad_scaler_is_said(fresh_tracer, tmp_path) -> None:
    got = {}
    for scaled in (True, False):
        tracer = fresh_tracer(warmup_steps=5, out_dir=tmp_path / str(scaled))
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", enabled=scaled)
        x, y = torch.randn(B, IN), torch.randn(B, OUT)
        for _ in range(10):
            with traceml.trace_step(model):
                scaler.scale(F.mse_loss(model(x), y)).backward()
                if scaled:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        got[scaled] = finish_and_load(tracer)["counters"]["settings"]["grad_scaler"]
    assert got == {True: True, False: False}


def test_python_calls_leave_out_what_traceml_ci_calls() -> None:
    """The tracer's housekeeping calls psutil on the training thread: a function only it
    calls is left out whole, one the user's code calls too loses the tracer's calls."""
    import json
    import json.encoder
    from collections import namedtuple

    from traceml_ci.tracer import pycalls
    from traceml_ci.tracer.sites import Sites

    Entry = namedtuple("Entry", "code callcount calls")
    Sub = namedtuple("Sub", "code callcount")
    ours, shared = pycalls.calls_block.__code__, json.dumps.__code__
    only_ours, user = json.encoder.JSONEncoder.encode.__code__, _fields.__code__
    stats = [
        Entry(ours, 1, [Sub(shared, 3), Sub(only_ours, 4)]),
        Entry(user, 2, [Sub(shared, 2)]),
        Entry(shared, 5, []),
        Entry(only_ours, 4, []),
        Entry("<built-in method len>", 9, []),
    ]
    block = pycalls.calls_block(stats, Sites())
    assert block == {"per_step": 2 + 2, "user": 2, "library": 2, "top_user": [
        {"at": _at("marker:fields-def"), "function": "_fields", "calls": 2}]}


def test_python_calls_of_code_a_library_made_count_as_the_librarys() -> None:
    """A dataclass's ``__init__`` is made at run time (its file: ``<string>``): called only by
    a library it is the library's; ``exec``'d code the user's own code calls stays theirs."""
    import dataclasses
    import json
    from collections import namedtuple

    from traceml_ci.tracer import pycalls
    from traceml_ci.tracer.sites import Sites

    made = dataclasses.make_dataclass("Out", [("x", int)]).__init__.__code__
    assert made.co_filename.startswith("<")
    mine: dict = {}
    exec(compile("def mine():\n    return 1\n", "<string>", "exec"), mine)
    user_made, library, user = mine["mine"].__code__, json.dumps.__code__, _fields.__code__
    Entry = namedtuple("Entry", "code callcount calls")
    Sub = namedtuple("Sub", "code callcount")
    stats = [
        Entry(library, 4, [Sub(made, 4)]),
        Entry(user, 2, [Sub(library, 4), Sub(user_made, 2)]),
        Entry(made, 4, []),
        Entry(user_made, 2, []),
    ]
    block = pycalls.calls_block(stats, Sites())
    assert (block["user"], block["library"]) == (2 + 2, 4 + 4)
    assert {r["function"] for r in block["top_user"]} == {"_fields", "mine"}


def _keeps_with_its_locals_held(steps: int = 10) -> tuple[dict, list]:
    """A training function that holds its own ``locals()`` dict (a config idiom)."""
    lr = 0.01
    hparams = locals()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    losses = []
    for _ in range(steps):
        with traceml.trace_step(model):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)  # marker:keep-loss
    return hparams, losses


def test_a_locals_dict_the_user_holds_is_left_as_it_is(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=5)
    hparams, losses = _keeps_with_its_locals_held()
    graph = finish_and_load(tracer)["counters"]["graph"]
    assert graph["held_by"] == {"name": "losses", "at": _at("marker:keep-loss")}
    assert hparams["lr"] == 0.01 and "losses" in hparams  # read, never emptied


def test_an_internal_error_in_the_sampled_step_leaves_nothing_armed(fresh_tracer) -> None:
    import gc

    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    tracer = fresh_tracer(warmup_steps=5)

    def end(step: int) -> None:  # the sampled step's end: our own code fails there
        raise RuntimeError("ours")

    tracer.counters.end = end
    _accumulate(_model())  # training goes on
    assert not tracer.enabled  # tracing stopped, saying so
    assert _get_current_function_mode_stack() == []
    assert _get_current_dispatch_mode_stack() == []
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert "item" not in torch.Tensor.__dict__ and gc.isenabled()


def test_a_mode_the_user_enters_in_the_sampled_step_outlives_ours(fresh_tracer) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    class Logger(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    tracer = fresh_tracer(warmup_steps=5)
    model, logger = _model(), Logger()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    for step in range(10):
        with traceml.trace_step(model):
            if step == 1:
                logger.__enter__()  # on from the sampled step...
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step == 1:
            assert _get_current_dispatch_mode_stack() == [logger]  # ours gone, theirs on
        if step == 3:
            logger.__exit__(None, None, None)  # ...to a later one
    finish_and_load(tracer)
    assert _get_current_dispatch_mode_stack() == []


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x * 2

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g * 2


def test_what_only_a_reference_cycle_keeps_is_not_kept(fresh_tracer) -> None:
    """A node and its output in a cycle go when the collector runs, a moment other threads'
    allocations set: collected before the check, they never count (or flicker)."""
    import gc

    tracer = fresh_tracer(warmup_steps=8)
    model = nn.Linear(IN, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(B, IN), torch.randn(B, 1)
    gc.disable()  # no collection by chance: only the check's own
    try:
        for _ in range(12):
            with traceml.trace_step(model):
                out = _Twice.apply(model(x))
                out.grad_fn.self_ref = out  # out -> its node -> out
                ((out - y) ** 2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                del out
    finally:
        gc.enable()
    c = finish_and_load(tracer)["counters"]
    assert c["graph"]["nodes_kept_per_step"] == 0
    assert c["leak"]["retained_bytes_per_step"] == 0
