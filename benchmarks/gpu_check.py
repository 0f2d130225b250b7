"""One-shot GPU check: run once on the first machine with a CUDA GPU; one PASS/FAIL line a check.

    python benchmarks/gpu_check.py                 # on a CUDA machine, < 3 minutes
    python benchmarks/gpu_check.py --device cpu    # the same checks on CPU (CUDA-only ones SKIP)

Checks: device events resolve; no per-step synchronisation (sync debug mode "error", and the
profiler's count of cuda*Synchronize calls in steady-state steps); per-step peak allocated /
reserved memory filled and plausible; NVML utilisation sampled; AMP GradScaler with skipped
steps; torch.compile on CUDA; overhead A/B on a ~2 ms and a ~20 ms step; DDP over NCCL with one
rank; the wait phase (an explicit all_reduce in a 1-rank group) and the h2d phase (a pinned batch
copied non_blocking) against stopwatches. Exit 0 when nothing FAILed. ``--json FILE`` also
writes the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import traceml_ci as traceml  # noqa: E402
from traceml_ci.errors import install_hint  # noqa: E402
from traceml_ci.summary.keys import phases_in  # noqa: E402
from traceml_ci.tracer import api  # noqa: E402
from traceml_ci.tracer.config import TracerConfig  # noqa: E402
from traceml_ci.tracer.modules import MIN_STEP_GAP  # noqa: E402

RESULTS: list[dict[str, Any]] = []
SKIPPED: set[str] = set()


class Skip(Exception):
    """The check cannot run here (no CUDA, no pynvml, ...)."""


def check(name: str) -> Callable[[Callable[..., str]], Callable[..., None]]:
    """Run a check, print one line: PASS/FAIL/SKIP, its name, its time and what it saw."""

    def wrap(fn: Callable[..., str]) -> Callable[..., None]:
        def run(*args: Any) -> None:
            t0 = time.perf_counter()
            try:
                if name in SKIPPED:
                    raise Skip("--skip")
                detail, status = fn(*args), "PASS"
            except Skip as exc:
                detail, status = str(exc), "SKIP"
            except AssertionError as exc:
                detail, status = f"{exc}", "FAIL"
            except Exception as exc:  # a crash is a failed check, not a stopped script
                detail = f"{type(exc).__name__}: {exc} | " + traceback.format_exc(limit=3)[-400:]
                status = "FAIL"
            finally:
                api.stop()
            took = time.perf_counter() - t0
            detail = " ".join(str(detail).split())
            print(f"{status} {name:<28} {took:6.1f}s  {detail}", flush=True)
            RESULTS.append({"check": name, "status": status, "s": round(took, 2), "detail": detail})

        return run

    return wrap


# -- jobs ------------------------------------------------------------------------------------
def scaled(width: int, device: str) -> int:
    """The GPU sizes; an eighth of the width on CPU, where this is a smoke run of the logic."""
    return width if device.startswith("cuda") else width // 8


def mlp(width: int, depth: int, device: str) -> nn.Module:
    width = scaled(width, device)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1)).to(device)


def job(width: int, depth: int, device: str, optimizer: type = torch.optim.AdamW,
        lr: float = 1e-4) -> tuple[nn.Module, torch.optim.Optimizer]:
    """An MLP (``mlp``) and its optimizer: what most checks train."""
    model = mlp(width, depth, device)
    return model, optimizer(model.parameters(), lr=lr)


def cuda_only(device: str, why: str = "CUDA only") -> None:
    """Skip the check on anything but CUDA."""
    if not device.startswith("cuda"):
        raise Skip(why)


def loader(width: int, batch: int, n_batches: int, device: str) -> torch.utils.data.DataLoader:
    width, pin = scaled(width, device), device.startswith("cuda")
    data = torch.utils.data.TensorDataset(
        torch.randn(batch * n_batches, width), torch.randn(batch * n_batches, 1)
    )
    return torch.utils.data.DataLoader(data, batch_size=batch, pin_memory=pin, drop_last=True)


def endless(dl: Any) -> Iterator[Any]:
    while True:
        yield from dl


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def tracing(out: Path, warmup: int = 3) -> Iterator[Any]:
    """A fresh tracer for one check; its summary dict is put in the yielded holder at exit."""
    holder: dict[str, Any] = {}
    tracer = api.start(TracerConfig(out_dir=out, warmup_steps=warmup), at_exit=False)
    try:
        yield holder
    finally:
        path = tracer.finish()
        if path is not None:
            holder.update(json.loads(Path(path).read_text()))


def train(
    model: nn.Module,
    opt: Any,
    batches: Iterator[Any],
    steps: int,
    device: str,
    traced: bool = True,
    scaler: Any = None,
    poison: set[int] | None = None,
) -> None:
    for i in range(steps):
        x, y = next(batches)
        ctx = traceml.trace_step(model) if traced else contextlib.nullcontext()
        with ctx:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            if scaler is None:
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                opt.step()
            else:
                with torch.autocast(device_type="cuda", dtype=torch.float16):
                    loss = ((model(x) - y) ** 2).mean()
                if poison and i in poison:
                    loss = loss * float("inf")  # inf grads: the scaler skips optimizer.step()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()


def shares(summary: dict[str, Any]) -> str:
    st = summary["step_time"]
    return " ".join(f"{p[:3]} {st[f'{p}_pct']}" for p in phases_in(st)) + f" | {st['diagnosis']}"


def assert_summary(summary: dict[str, Any], clock: str | None = None) -> None:
    st = summary.get("step_time") or {}
    assert st.get("steps_analyzed", 0) > 0, f"no step analysed: {st}"
    total = sum(st[f"{p}_pct"] for p in phases_in(st))  # h2d and wait where the run had them
    assert abs(total - 100) < 0.5, f"shares add up to {total}"
    if clock is not None:
        assert st["clock"] == clock, f"clock {st['clock']!r}, expected {clock!r}"


# -- checks ----------------------------------------------------------------------------------
@check("device events resolve")
def events_resolve(device: str, out: Path) -> str:
    model, opt = job(1024, 4, device)
    with tracing(out / "events") as s:
        train(model, opt, endless(loader(1024, 256, 32, device)), 60, device)
    assert_summary(s, "device_event" if device.startswith("cuda") else "host")
    assert s["step_time"]["steps_analyzed"] >= 50, s["step_time"]["steps_analyzed"]
    return shares(s)


@check("no per-step synchronisation")
def no_sync(device: str, out: Path) -> str:
    cuda_only(device)
    model, opt = job(1024, 4, device)
    batches = endless(loader(1024, 256, 32, device))
    with tracing(out / "nosync") as s:
        train(model, opt, batches, 10, device)  # warm-up: first-step set-up may sync once
        torch.cuda.set_sync_debug_mode("error")
        try:
            train(model, opt, batches, 40, device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            train(model, opt, batches, 40, device)
            steps = 40
    assert_summary(s, "device_event")
    syncs = {
        e.key: e.count
        for e in prof.key_averages()
        if "Synchronize" in e.key and e.key.startswith("cuda")
    }
    n = sum(syncs.values())
    # A handful in 40 steps may come from the tracer catching up (> 64 steps behind) -- never
    # one a step.
    assert n < steps / 4, f"{n} synchronize calls in {steps} steps: {syncs}"
    return f"sync-debug 'error' passed 40 steps; profiler: {n} sync calls in {steps} steps {syncs}"


@check("peak memory filled")
def peak_memory(device: str, out: Path) -> str:
    cuda_only(device, "CUDA only (CPU has RSS only)")
    model, opt = job(2048, 4, device)
    params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    with tracing(out / "mem") as s:
        train(model, opt, endless(loader(2048, 512, 16, device)), 30, device)
    mem = s["step_memory"]
    alloc, res, total = mem["peak_allocated_mb"], mem["peak_reserved_mb"], mem["device_total_mb"]
    assert alloc is not None and res is not None, mem
    # weights + grads + two Adam moments at least
    assert alloc >= 3.5 * params_mb, f"peak allocated {alloc} MB < 3.5 x params {params_mb:.0f}"
    assert alloc <= res <= (total or float("inf")), f"alloc {alloc} reserved {res} total {total}"
    return f"params {params_mb:.0f} MB, peak allocated {alloc} MB, reserved {res} MB of {total}"


@check("NVML utilisation sampled")
def nvml(device: str, out: Path) -> str:
    cuda_only(device)
    try:
        import pynvml  # noqa: F401
    except ImportError:
        raise Skip(f"pynvml missing: {install_hint('gpu')}") from None
    model, opt = job(4096, 6, device, torch.optim.SGD)
    with tracing(out / "nvml") as s:
        t0 = time.perf_counter()
        batches = endless(loader(4096, 1024, 8, device))
        while time.perf_counter() - t0 < 4:  # a few sampling periods
            train(model, opt, batches, 20, device)
    gpu = s["gpu"]
    assert gpu["samples"] and gpu["samples"] >= 2, gpu
    assert gpu["util_mean_pct"] is not None and gpu["util_mean_pct"] > 10, gpu
    return f"{gpu}"


@check("AMP GradScaler skipped steps")
def amp(device: str, out: Path) -> str:
    cuda_only(device)
    model, opt = job(1024, 3, device, torch.optim.SGD, 1e-3)
    scaler = torch.amp.GradScaler("cuda")
    poison = {12, 20, 31}
    with tracing(out / "amp") as s:
        train(
            model,
            opt,
            endless(loader(1024, 256, 16, device)),
            40,
            device,
            scaler=scaler,
            poison=poison,
        )
    assert_summary(s, "device_event")
    st = s["step_time"]
    assert st["steps_total"] == 40, f"steps_total {st['steps_total']} != 40 loop iterations"
    return f"40 steps, {len(poison)} skipped by the scaler: {shares(s)}"


@check("torch.compile")
def compiled(device: str, out: Path) -> str:
    model = mlp(1024, 4, device)
    cmodel = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = endless(loader(1024, 256, 32, device))
    with tracing(out / "compile", warmup=5) as s:
        for _ in range(40):
            x, y = next(batches)
            with traceml.trace_step(cmodel):
                x, y = x.to(device), y.to(device)
                opt.zero_grad(set_to_none=True)
                loss = ((cmodel(x) - y) ** 2).mean()
                loss.backward()
                opt.step()
    assert_summary(s)
    assert s["step_time"]["forward_pct"] > 0, shares(s)
    return shares(s)


def ab(
    device: str, out: Path, width: int, depth: int, batch: int, blocks: int, steps: int
) -> tuple[float, float, float]:
    """Alternating traced/untraced blocks of wall time (synced at block ends): ms a step
    untraced, ms traced, and the median of the paired ratios."""
    model, opt = job(width, depth, device)
    batches = endless(loader(width, batch, 16, device))
    tracer = api.start(TracerConfig(out_dir=out, warmup_steps=0), at_exit=False)

    def block(traced: bool) -> float:
        if traced:
            tracer.patches.install()
        else:
            tracer.patches.uninstall()
        sync(device)
        t0 = time.perf_counter()
        train(model, opt, batches, steps, device, traced=traced)
        sync(device)
        return (time.perf_counter() - t0) / steps * 1000

    block(False)
    block(True)
    on, off = [], []
    for b in range(blocks):
        for traced in (True, False) if b % 2 == 0 else (False, True):
            (on if traced else off).append(block(traced))
    tracer.patches.install()
    tracer.finish()
    api.stop()
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return statistics.median(off), statistics.median(on), statistics.median(ratios)


@check("overhead A/B")
def overhead(device: str, out: Path, quick: bool) -> str:
    if device.startswith("cuda"):
        cases = (("~2 ms", 2048, 4, 1024, 1.03), ("~20 ms", 4096, 8, 8192, 1.01))
    else:
        cases = (("cpu small", 256, 2, 64, 1.10),)
    blocks, steps = (4, 10) if quick else (20, 30)
    lines, bad = [], []
    for name, width, depth, batch, limit in cases:
        # --quick (the test suite's smoke run: 40 steps a side, maybe on a loaded machine)
        # reports the ratio without judging it: the figure is the full run's.
        off, on, ratio = ab(device, out / name.replace(" ", ""), width, depth, batch, blocks, steps)
        judged = f"(<= {limit})" if not quick else "(not judged in --quick)"
        lines.append(f"{name}: {off:.3f} -> {on:.3f} ms/step, ratio {ratio:.4f} {judged}")
        if ratio > limit and not quick:
            bad.append(name)
    assert not bad, "; ".join(lines)
    return "; ".join(lines)


@check("DDP, one rank")
def ddp(device: str, out: Path) -> str:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    backend = "nccl" if device.startswith("cuda") else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        model = DDP(mlp(1024, 4, device), device_ids=[0] if backend == "nccl" else None)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        with tracing(out / "ddp") as s:
            train(model, opt, endless(loader(1024, 256, 32, device)), 40, device)
    finally:
        dist.destroy_process_group()
    assert_summary(s)
    assert s["step_time"]["backward_pct"] > 0, shares(s)
    return f"{backend}: {shares(s)}"


def matches(traced_ms: float | None, watch_ms: list[float], what: str) -> str:
    """The tracer's median ms of a phase agrees with a stopwatch's median of the same calls
    (within 0.3 ms + 30 %: the stopwatch's syncs and the events' placement differ a little)."""
    truth = statistics.median(watch_ms)
    assert traced_ms is not None, f"no {what} phase in the summary"
    assert abs(traced_ms - truth) <= 0.3 + 0.3 * truth, (
        f"{what}: traced {traced_ms:.3f} ms, stopwatch {truth:.3f} ms"
    )
    return f"{what} {traced_ms:.3f} ms vs stopwatch {truth:.3f} ms"


@check("wait phase")
def wait_phase(device: str, out: Path) -> str:
    """An explicit all_reduce inside each step of a 1-rank group (nccl on CUDA, gloo on CPU):
    the summary's wait phase against a stopwatch with the device synchronised around the call."""
    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = "29518"
    model, opt = job(1024, 4, device)
    batches = endless(loader(1024, 256, 32, device))
    grads = torch.randn(scaled(16 * 2**20, device), device=device)  # 64 MB on a GPU
    watch: list[float] = []
    with tracing(out / "wait") as s:
        dist.init_process_group(backend, rank=0, world_size=1)  # after start: the tracer sees it
        try:
            for i in range(40):
                x, y = next(batches)
                with traceml.trace_step(model):
                    x, y = x.to(device), y.to(device)
                    opt.zero_grad(set_to_none=True)
                    ((model(x) - y) ** 2).mean().backward()
                    sync(device)
                    t0 = time.perf_counter()
                    dist.all_reduce(grads)
                    sync(device)
                    if i >= 3:  # the warmup steps
                        watch.append((time.perf_counter() - t0) * 1000)
                    opt.step()
        finally:
            dist.destroy_process_group()
    assert_summary(s)
    assert "wait_pct" in s["step_time"], shares(s)
    return f"{backend}: " + matches(s["step_time"]["phase_ms"].get("wait"), watch, "wait")


@check("h2d phase")
def h2d_phase(device: str, out: Path) -> str:
    """A pinned batch copied ``.to("cuda", non_blocking=True)`` inside each step: the summary's
    h2d phase (device events, no sync) against a stopwatch with the device synchronised around
    the copy."""
    cuda_only(device)
    model, opt = job(1024, 4, device)
    host = torch.randn(16 * 2**20).pin_memory()  # 64 MB: a few ms over PCIe
    target = torch.randn(256, scaled(1024, device), device=device)
    watch: list[float] = []
    with tracing(out / "h2d") as s:
        for i in range(40):
            with traceml.trace_step(model):
                sync(device)
                t0 = time.perf_counter()
                batch = host.to("cuda", non_blocking=True)
                sync(device)
                if i >= 3:
                    watch.append((time.perf_counter() - t0) * 1000)
                opt.zero_grad(set_to_none=True)
                x = target + batch[: target.numel()].view_as(target)
                ((model(x)) ** 2).mean().backward()
                opt.step()
    assert_summary(s, "device_event")
    st = s["step_time"]
    assert "h2d_pct" in st, shares(s)
    gb_s = host.numel() * 4 / 2**30 / (st["phase_ms"]["h2d"] / 1000)
    return matches(st["phase_ms"]["h2d"], watch, "h2d") + f" ({gb_s:.1f} GiB/s) | {shares(s)}"


class Wide(nn.Module):
    """An MLP whose middle block is four times wider: the slow module to find."""

    def __init__(self, width: int, device: str) -> None:
        super().__init__()
        w = scaled(width, device)
        self.inp = nn.Linear(w, w)
        self.wide = nn.Sequential(nn.Linear(w, 4 * w), nn.ReLU(), nn.Linear(4 * w, w))
        self.out = nn.Linear(w, 1)
        self.to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.wide(torch.relu(self.inp(x)))))


class Stopwatch:
    """Host stopwatches on ``names``' own calls in the steps the tracer samples (its hooks on the
    module beside these): forward from the call to its return; backward from the gradient
    reaching the module's output to the gradient of its input, or of its last parameter where
    no input takes one. On CPU these time the very calls the tracer's host clock timed, under
    the same load: what the tracer ranks first must be what they rank first."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        self.ms: dict[str, dict[str, list[float]]] = {"forward": {}, "backward": {}}
        self.handles: list[Any] = []
        for name in names:
            module = model.get_submodule(name)
            self.handles.append(module.register_forward_pre_hook(self._pre(name)))
            self.handles.append(module.register_forward_hook(self._post(name)))

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            sampled = len(module._forward_pre_hooks) > 1  # the tracer's hook beside this one
            module._stopwatch = (time.perf_counter(), sampled)  # type: ignore[assignment]

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            t0, sampled = module._stopwatch  # type: ignore[misc]
            if not sampled:
                return
            self.ms["forward"].setdefault(name, []).append((time.perf_counter() - t0) * 1000)
            start: list[float] = []
            ends = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
            if not ends:
                ends = [p for p in module.parameters() if p.requires_grad]
            left = [len(ends)]

            def begin(grad: Any) -> None:
                start.append(time.perf_counter())

            def end(grad: Any) -> None:
                left[0] -= 1
                if left[0] == 0 and start:
                    ms = (time.perf_counter() - start[0]) * 1000
                    self.ms["backward"].setdefault(name, []).append(ms)

            if isinstance(output, torch.Tensor) and output.requires_grad and ends:
                output.register_hook(begin)
                for t in ends:
                    hook_handle = t.register_hook(end)
                    if isinstance(t, nn.Parameter):  # one step's hook, not every step's
                        self.handles.append(hook_handle)

        return hook

    def mean_ms(self, phase: str) -> dict[str, float]:
        return {name: statistics.fmean(ms) for name, ms in self.ms[phase].items() if ms}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


#: The tracer's first module may trail the stopwatches' first by this fraction and still lead:
#: the two clocks differ by a hook's work, and the tracer leaves out samples it could not close.
STOPWATCH_TIE = 0.75


def _contended(summary: dict[str, Any]) -> bool:
    """Whether the run waited for a CPU past the gate's contention mark (summary/keys.py)."""
    from traceml_ci.summary.keys import CONTENDED_RUNQUEUE_WAIT_PCT

    wait = ((summary.get("run") or {}).get("contention") or {}).get("runqueue_wait_pct")
    return isinstance(wait, (int, float)) and wait >= CONTENDED_RUNQUEUE_WAIT_PCT


@check("modules, FLOPs, profile")
def pinpoint(device: str, out: Path) -> str:
    """Module times on the phases' clock (device events on CUDA), the slow block named in
    forward and backward; FLOPs counted (MFU where the GPU's peak is known); a profile of a
    few steps whose device self time is not counted twice."""
    cuda = device.startswith("cuda")
    model = Wide(1024, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = endless(loader(1024, 256, 32, device))
    holder: dict[str, Any] = {}
    warmup, profiled, every_s, samples = 3, 3, 0.05, 3
    tracer = api.start(TracerConfig(out_dir=out / "pinpoint", warmup_steps=warmup,
                                    module_sample_s=every_s, profile_steps=profiled),
                       at_exit=False)  # fmt: skip
    # Enough steps for several module samples, counted in steps as well as seconds: a loaded
    # machine runs fewer steps a second, and at most one step in MIN_STEP_GAP is sampled.
    min_steps = warmup + profiled + (samples + 2) * MIN_STEP_GAP
    steps = 0
    stopwatch = Stopwatch(model, ("inp", "wide", "out"))
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2.0 or steps < min_steps:
            train(model, opt, batches, 10, device)
            steps += 10
    finally:
        stopwatch.remove()
        path = tracer.finish()
        if path is not None:
            holder.update(json.loads(Path(path).read_text()))
    assert_summary(holder, "device_event" if cuda else "host")
    mods = holder["modules"]
    assert mods["clock"] == ("device_event" if cuda else "host"), mods
    assert mods["sampled_steps"] >= samples and mods.get("backward_steps", 0) >= samples, (
        f"{steps} steps run: {mods}"
    )
    timed = {}
    for phase in ("forward", "backward"):
        top = mods[phase][0]
        if cuda:  # device time: four times the width is the slow block, whatever the CPU does
            assert top["name"] == "wide", f"{phase}: {mods[phase][:3]}"
            continue
        # Host time, on a CPU that other work may take at any moment: a module the scheduler
        # paused in a sampled call took that long, for the tracer and for a stopwatch alike.
        # The tracer must rank first what the stopwatches on the same calls rank first.
        watch = stopwatch.mean_ms(phase)
        timed[phase] = ", ".join(f"{k} {v:.2f}" for k, v in watch.items())
        owner = top["name"].split(".")[0]  # a child of the block leads: the block's time
        assert watch and owner in watch, f"{phase}: {mods[phase][:3]}; stopwatch ms {watch}"
        if _contended(holder):  # a host clock on a CPU other work took: times inform, as in
            timed[phase] += " (contended CPU: not ranked)"  # the gate (docs/gate.md)
            continue
        assert watch[owner] >= STOPWATCH_TIE * max(watch.values()), (
            f"{phase}: tracer {mods[phase][:3]}; stopwatch ms on the sampled calls {watch}"
        )
    eff = holder["efficiency"]
    assert eff.get("flops_per_step"), eff
    if cuda:
        assert eff.get("achieved_tflops"), eff
    from traceml_ci.summary.profile import TOP_OPS_FILENAME, profile_dir, read_top_ops

    ops = read_top_ops(profile_dir(out / "pinpoint") / TOP_OPS_FILENAME)
    step_ms = holder["step_time"]["step_ms"]["median"]
    total = sum(o.host_self_ms + (o.device_self_ms or 0.0) for o in ops.ops)
    if cuda:
        device_ms = sum(o.device_self_ms or 0.0 for o in ops.ops)
        assert device_ms > 0, "no device self time in the profile"
        # Device self time per step: at most the step (kernels counted once, not per launch op).
        assert device_ms <= 1.5 * step_ms, f"device self {device_ms:.2f} ms > step {step_ms} ms"
    fwd = mods["forward"][0]
    bwd = mods["backward"][0]
    watched = "".join(f"; stopwatch {p} ms: {t}" for p, t in timed.items())
    return (
        f"{fwd['name']}: fwd {fwd['share_pct']} %, {bwd['name']}: bwd {bwd['share_pct']} % "
        f"({mods['clock']}{watched}); "
        f"{eff['flops_per_step'] / 1e9:.2f} GFLOP/step, {eff.get('achieved_tflops')} TFLOP/s,"
        f" MFU {eff.get('mfu_pct')}; profile top {ops.ops[0].name} of {total:.2f} ms/step"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default, help=f"cuda or cpu (default {default})")
    parser.add_argument("--quick", action="store_true", help="fewer A/B blocks (a smoke run)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CHECK",
        help="leave a check out (its name as printed, e.g. torch.compile)",
    )
    args = parser.parse_args(argv)
    SKIPPED.update(args.skip)
    device = args.device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("FAIL cuda requested but torch.cuda.is_available() is False")
            return 1
        props = torch.cuda.get_device_properties(0)
        print(
            f"# {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}"
        )
    else:
        torch.set_num_threads(1)
        print(f"# CPU only (torch {torch.__version__}): CUDA-only checks SKIP")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        events_resolve(device, out)
        no_sync(device, out)
        peak_memory(device, out)
        nvml(device, out)
        amp(device, out)
        compiled(device, out)
        overhead(device, out, args.quick)
        ddp(device, out)
        pinpoint(device, out)
        wait_phase(device, out)
        h2d_phase(device, out)
    failed = [r["check"] for r in RESULTS if r["status"] == "FAIL"]
    took = time.perf_counter() - t0
    print(
        f"# {len(RESULTS) - len(failed)}/{len(RESULTS)} not failed in {took:.0f} s"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
