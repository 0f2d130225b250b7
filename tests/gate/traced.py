"""Real traced torch loops for gate tests: one base, and variants that each change one thing
(the DataLoader's workers, the optimizer, a layer's width, a scalar read per step, hostile
names). ``record(root)`` runs them all in this process and returns their summaries."""

from __future__ import annotations

import importlib.util
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

B, IN, OUT, STEPS, WARMUP = 8, 16, 4, 12, 5
HERE = os.path.relpath(__file__)
#: A module name and a file name no report may pass on as they are: markdown table and HTML
#: syntax, a mention, a backtick, a terminal escape (a module name cannot hold a dot).
HOSTILE_MODULE = "x|<b>@team`[y](z)"
HOSTILE_FILE = "evil|<i>@team\x1b[31m.py"


def line(marker: str) -> int:
    """The line of this file that carries ``marker`` (no test hard-codes a line number)."""
    with open(__file__) as f:
        lines = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(lines) == 1, marker
    return lines[0]


def item_site(verb: str = "adds") -> str:
    """The counters' sentence for the variant's added ``loss.item()`` per step."""
    return f"{verb} 1 scalar read per step at {HERE}:{line('marker:item')} (item)"


def loop(
    *,
    workers: int = 2,
    opt: str = "sgd",
    hidden: int = 32,
    item: bool = False,
    read: Any = None,
    first: str = "fc1",
) -> None:
    """A traced training loop over a real DataLoader: the one thing a variant changes."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import traceml_ci as traceml

    torch.manual_seed(0)
    model = nn.Sequential(
        OrderedDict([(first, nn.Linear(IN, hidden)), ("act", nn.ReLU()),
                     ("fc2", nn.Linear(hidden, OUT))])
    )
    cls = torch.optim.AdamW if opt == "adamw" else torch.optim.SGD
    optimizer = cls(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(STEPS * B, IN), torch.randn(STEPS * B, OUT))
    for x, y in DataLoader(data, batch_size=B, num_workers=workers):
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            if item:
                loss.item()  # marker:item
            if read is not None:
                read(loss)


def hostile_reader(folder: Path) -> Any:
    """A function, in a file with a hostile name, that reads the loss as a Python float."""
    path = folder / HOSTILE_FILE
    path.write_text("def read(loss):\n    return loss.item()\n")
    spec = importlib.util.spec_from_file_location("hostile_reader", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read


def record(root: Path) -> dict[str, dict[str, Any]]:
    """name -> the summary each variant's traced loop wrote (under ``root``)."""
    import torch

    from tests.tracer.conftest import finish_and_load
    from traceml_ci.tracer import api, flops
    from traceml_ci.tracer.config import TracerConfig

    variants: dict[str, dict[str, Any]] = {
        "base": {},
        "workers0": {"workers": 0},
        "adamw": {"opt": "adamw"},
        "wide": {"hidden": 64},
        "item": {"item": True},
        "hostile_base": {"first": HOSTILE_MODULE},
        "hostile_head": {"first": HOSTILE_MODULE, "hidden": 64, "read": hostile_reader(root)},
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out: dict[str, dict[str, Any]] = {}
    # Another test in this process may have compiled (which turns the FLOP count off for the
    # process): these loops count as a fresh process would.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: False)
        try:
            for name, options in variants.items():
                config = TracerConfig(out_dir=root / name, warmup_steps=WARMUP, run_name=name)
                tracer = api.start(config, at_exit=False)
                try:
                    loop(**options)
                    out[name] = finish_and_load(tracer)
                finally:
                    api.stop()
        finally:
            torch.set_num_threads(threads)
    return out
