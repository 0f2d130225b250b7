"""Tiny training scripts written into tmp folders for `traceml-ci run` tests."""

from __future__ import annotations

from pathlib import Path

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
        "traceml.init(mode='auto', run_name='from-script', warmup_steps=2)\n" + LOOP + "train(30)\n"
    ),
}


def write_script(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_text(SCRIPTS[name])
    return path
