"""Tiny scripts written into tmp folders for the launcher's tests (most need no torch), and
running them in a process group that is killed whatever happens."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LOOP = """
import os, sys, time
import torch
from torch import nn
torch.set_num_threads(1)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
def train(steps):
    n = 0
    while True:
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            n += 1
            if n >= steps:
                return
"""

SCRIPTS = {
    "exit3.py": LOOP + "train(20)\nsys.exit(3)\n",
    "crash.py": LOOP + "train(20)\nraise RuntimeError('diverged')\n",
    "forever.py": LOOP
    + "train(20)\nprint('ready', os.getpid(), flush=True)\nwhile True:\n    train(10**9)\n",
    "with_init.py": (
        "import traceml_ci as traceml\n"
        "traceml.init(mode='auto', run_name='from-script', warmup_steps=2, out_dir='mine')\n"
        + LOOP
        + "train(30)\n"
    ),
}


#: Top-level init() (as the README shows), worker DataLoaders, an explicit finish(), and an
#: independent stopwatch written to argv[1]. argv[2:]: one DataLoader (one worker) each,
#: "METHOD" or "METHOD:persistent" (METHOD: the multiprocessing start method); each one's
#: workers start before the first step and hand over two of the warmup steps' batches, in
#: turn (a fresh worker's first two batches take seconds: it imports torch, then more), then
#: the analysed steps take each loader's batches, a block apiece. Spawned and forkserver
#: workers re-import this file and re-run init().
WORKERS = """
import json, sys, time
import torch
from torch import nn
import traceml_ci as traceml

traceml.init(mode="auto", warmup_steps=6)
torch.set_num_threads(1)
COSTS = {"dataloader": 6.0, "forward": 3.0, "backward": 3.0, "optimizer": 2.0}


def busy(ms):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        return torch.randn(8), torch.randn(1)


def collate(items):
    busy(COSTS["dataloader"])  # in the worker: the main process waits part of it
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


class SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        busy(COSTS["backward"])
        return grad


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 1)

    def forward(self, x):
        busy(COSTS["forward"])
        return SlowBackward.apply(self.lin(x))


class SlowSGD(torch.optim.SGD):
    def step(self, closure=None):
        busy(COSTS["optimizer"])
        return super().step(closure)


def timed(watch, phase, fn, *args):
    start = time.perf_counter_ns()
    try:
        return fn(*args)
    finally:
        watch[-1][phase] += (time.perf_counter_ns() - start) / 1e6


STEPS = 40


def main(out, *loaders):
    model = Model()
    opt = SlowSGD(model.parameters(), lr=0.01)
    held, iters = [], []  # the loaders live as long as their iterators, as in a training loop
    for spec in loaders:
        context, _, persistent = spec.partition(":")
        held.append(torch.utils.data.DataLoader(
            Data(), batch_size=4, num_workers=1, collate_fn=collate,
            multiprocessing_context=context, persistent_workers=persistent == "persistent",
        ))
        iters.append(iter(held[-1]))
    n, warm = len(iters), 2 * len(iters)  # at most 3 loaders: 6 warmup steps
    watch, walls = [], []
    for step in range(STEPS):
        batches = iters[step % n if step < warm else (step - warm) * n // (STEPS - warm)]
        start = time.perf_counter_ns()
        watch.append(dict.fromkeys(COSTS, 0.0))
        x, y = timed(watch, "dataloader", next, batches)
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            loss = ((timed(watch, "forward", model, x) - y) ** 2).mean()
            timed(watch, "backward", loss.backward)
            timed(watch, "optimizer", opt.step)
        walls.append((time.perf_counter_ns() - start) / 1e6)
    traceml.finish()
    with open(out, "w") as fh:
        json.dump({"walls": walls, "phases": watch}, fh)
    # Returning frees the iterators: their workers shut down and exit normally, as they do
    # at the end of an epoch, while this process still runs.


if __name__ == "__main__":
    import multiprocessing

    main(*sys.argv[1:])
    # Workers gone while this process still runs (an event, not a fixed wait: the freed
    # iterators have joined them by now, or they are on their way out).
    end = time.monotonic() + 30
    while multiprocessing.active_children() and time.monotonic() < end:
        time.sleep(0.02)
    print("done", flush=True)
"""

#: A second process in the same output folder: starts tracing, waits for argv[1] to exist,
#: then finishes (after another process has written its summary there meanwhile).
LATE = """
import os, sys, time
import torch
import traceml_ci as traceml
traceml.init(mode="manual", out_dir=sys.argv[2])
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
traceml.finish()
"""

#: Needs no torch: the launcher's tests that only check exits and signals start fast.
PLAIN = {
    "plain_exit3.py": (
        "import sys\nprint('hello', sys.argv[1:], 'torch' in sys.modules)\nsys.exit(3)\n"
    ),
    "plain_forever.py": (
        "import os, time\nprint('ready', os.getpid(), flush=True)\n"
        "while True:\n    time.sleep(0.01)\n"
    ),
}

#: ``traceml-ci run -m pkg.train ARGS``, like ``python -m``.
PACKAGE = {
    "pkg/__init__.py": "",
    "pkg/train.py": (
        "import sys\nprint('module', __name__, sys.argv[1:])\nsys.exit(len(sys.argv) - 1)\n"
    ),
}

#: Trains forever from a 2-worker DataLoader, after printing "ready PID" once 20 steps ran.
WORKERS_FOREVER = """
import os
import torch
from torch import nn
torch.set_num_threads(1)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 10**9

    def __getitem__(self, i):
        return torch.randn(8), torch.randn(1)


if __name__ == "__main__":
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Data(), batch_size=8, num_workers=2)
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step == 20:
            print("ready", os.getpid(), flush=True)
"""

SCRIPTS.update(
    {**PACKAGE, "workers_forever.py": WORKERS_FOREVER, "workers.py": WORKERS, "late.py": LATE,
     **PLAIN}
)


def write_script(folder: Path, name: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SCRIPTS[name])
    return path


def run_group(
    cmd: list[str], cwd: Path, timeout: float = 120, **popen: object
) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group and kill the whole group however the run ends
    (timeout, failed assertion, Ctrl-C), DataLoader workers included: a failed test leaves
    nothing running. No progress lines (a slow, loaded run would add one to stderr)."""
    env = dict(popen.pop("env", None) or os.environ)  # type: ignore[call-overload]
    env.setdefault("TRACEML_CI_PROGRESS_INTERVAL", "0")
    popen["env"] = env
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, **popen,  # type: ignore[arg-type]
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (it was started with start_new_session=True)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)


def run_together(calls: dict[str, Callable[[], T]]) -> dict[str, T]:
    """Independent runs (each one ``run_group`` or the like, which cleans up after itself)
    started together rather than one after another: name -> what its call returned. The first
    failure is raised once every call has ended."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
    return {name: future.result() for name, future in futures.items()}
