"""The corpus of one-line changes to the ``mlrepo/`` template that the gate should see.

Each change is a named edit of the template (file, old text, new text: exact, applied exactly
once), what it is (the PyTorch Performance Tuning Guide / FAQ item, or the issue's list), the
smoke test(s) it should show in, and the cause the gate should name for it: substrings, any one
of which in a test's causes or reasons counts (case-insensitive). ``{line}`` in a cause is the
line number of the edit in the changed file (where the counted thing lives, in the head forward
and in the base reversed).

Reversed (``run.py --reverse``), the changed code is the base and the original the head: the fix
applied, which should show ``improved``. A ``harmless`` change must pass both ways.

    python benchmarks/cisuite/changes.py            # list the corpus
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "mlrepo"

CNN = "tests/test_smoke.py::test_cnn_trains"
GPT2 = "tests/test_smoke.py::test_gpt2_trains"
ACCUM = "tests/test_smoke.py::test_grad_accumulation"
DDP = "tests/test_smoke.py::test_ddp_two_ranks"
TESTS = (CNN, GPT2, ACCUM, DDP)


class EditError(ValueError):
    """An edit that does not apply exactly once (the template moved under the corpus)."""


@dataclass(frozen=True)
class Edit:
    path: str  # relative to the template's root
    old: str
    new: str

    def apply(self, root: Path, reverse: bool = False) -> None:
        """Replace ``old`` by ``new`` (``new`` by ``old`` when ``reverse``) in ``root/path``."""
        old, new = (self.new, self.old) if reverse else (self.old, self.new)
        file = root / self.path
        text = file.read_text()
        count = text.count(old)
        if count != 1:
            raise EditError(f"{file}: expected the text to replace exactly once, found it "
                            f"{count} times: {old!r}")
        file.write_text(text.replace(old, new, 1))

    def line(self, root: Path = TEMPLATE) -> int:
        """The 1-based line, in the changed file, of the first line the edit changes."""
        text = (root / self.path).read_text()
        start = text.index(self.old)
        old_lines, new_lines = self.old.splitlines(), self.new.splitlines()
        first = next((i for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=False))
                     if a != b),
                     min(len(old_lines), len(new_lines)))
        return text.count("\n", 0, start) + first + 1


@dataclass(frozen=True)
class Change:
    name: str
    edits: tuple[Edit, ...]
    what: str  # the Tuning Guide / FAQ item
    tests: tuple[str, ...]  # the smoke tests it shows in (node ids)
    causes: tuple[str, ...] = ()  # what the gate should name: any of these substrings
    issue: tuple[int, ...] = (32,)
    harmless: bool = False  # must pass, both ways

    def apply(self, root: Path, reverse: bool = False) -> None:
        for edit in self.edits:
            edit.apply(root, reverse)

    def expected_causes(self, root: Path = TEMPLATE) -> list[str]:
        """The cause substrings with ``{line}`` filled in."""
        line = self.edits[0].line(root)
        return [c.format(line=line) for c in self.causes]


def _e(path: str, old: str, new: str) -> tuple[Edit, ...]:
    return (Edit(path, old, new),)


TRAIN, DATA, MODELS, DDP_SCRIPT = ("mlrepo/train.py", "mlrepo/data.py", "mlrepo/models.py",
                                   "mlrepo/ddp_train.py")
_STEP = "            with traceml.trace_step(model):\n"

CHANGES: tuple[Change, ...] = (
    # -- issue 31: counts decide -----------------------------------------------------------
    Change("item_per_step",
           _e(TRAIN, "                losses.append(loss.detach())\n",
              "                losses.append(loss.item())\n"),
           "a per-step loss.item(): a host-device sync every step (Tuning Guide: avoid "
           "unnecessary CPU-GPU synchronization)",
           (CNN,), ("train.py:{line}",), issue=(31,)),
    Change("conv_5x5",
           _e(MODELS, "nn.Conv2d(width, 2 * width, kernel_size=3, padding=1)",
              "nn.Conv2d(width, 2 * width, kernel_size=5, padding=2)"),
           "a 3x3 convolution made 5x5 (2.8x its FLOPs)",
           (CNN,), ("conv2",), issue=(31,)),
    Change("keep_logits",
           _e(TRAIN, "            predictions.append(out.logits.argmax(-1))\n",
              "            predictions.append(out.logits)\n"),
           "an output kept alive across steps, with its graph (FAQ: don't accumulate "
           "history across your training loop)",
           (GPT2,), ("train.py:{line}",), issue=(31,)),
    Change("sgd_to_adamw",
           _e(TRAIN, "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)",
              "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)"),
           "SGD replaced by AdamW (+1 state tensor per parameter, more optimizer work)",
           (CNN,), ("SGD → AdamW", "AdamW"), issue=(31,)),
    Change("wider_model",
           _e(MODELS, "def __init__(self, num_classes: int = 10, width: int = 16):",
              "def __init__(self, num_classes: int = 10, width: int = 24):"),
           "a uniformly wider CNN (every layer 1.5x the channels)",
           (CNN,), ("FLOPs per step", "parameters"), issue=(31,)),
    Change("no_workers",
           _e(DATA, "batch_size: int = 32, num_workers: int = 2)",
              "batch_size: int = 32, num_workers: int = 0)"),
           "DataLoader num_workers 2 -> 0: loading and augmentation on the training thread "
           "(Tuning Guide: enable async data loading and augmentation)",
           (CNN,), ("num_workers",), issue=(31, 32)),
    Change("rename",
           _e(TRAIN, "                logits = model(images)\n"
                     "                loss = F.cross_entropy(logits, labels)\n",
              "                scores = model(images)\n"
              "                loss = F.cross_entropy(scores, labels)\n"),
           "a harmless rename of a local variable (must pass)",
           (CNN,), issue=(31,), harmless=True),
    Change("comment_line",
           _e(TRAIN, "    model.train()\n    losses, progress = [], []\n",
              "    model.train()\n    # one loss per step, averaged at the end\n"
              "    losses, progress = [], []\n"),
           "a comment line added: every later line of train.py moves down one (must pass: the "
           "same counts at other lines)",
           (CNN, GPT2), issue=(31,), harmless=True),
    # -- issue 32: the Tuning Guide's items that run on a CPU ------------------------------
    Change("progress_line_per_step",
           _e(TRAIN, "                losses.append(loss.detach())\n",
              "                losses.append(loss.detach())\n"
              "                progress.append(progress_line(_epoch, model, optimizer))\n"),
           "a JSON progress line built every step (it walks the model's parameters in Python): "
           "per-step Python work that runs no ATen op",
           (CNN,), ("progress_line", "Python calls")),
    Change("zero_grad_no_set_to_none",
           _e(TRAIN, _STEP + "                optimizer.zero_grad(set_to_none=True)\n",
              _STEP + "                optimizer.zero_grad(set_to_none=False)\n"),
           "zero_grad(set_to_none=False): a memset of every gradient each step (Tuning Guide: "
           "use parameter.grad = None instead of model.zero_grad())",
           (CNN,), ("set_to_none", "train.py:{line}")),
    Change("adamw_foreach_off",
           _e(TRAIN, "torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)",
              "torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, foreach=False)"),
           "the optimizer's foreach (multi-tensor) implementation turned off: a Python loop of "
           "per-parameter kernels (Tuning Guide: use fused / foreach optimizers)",
           (GPT2,), ("foreach",)),
    Change("clip_foreach_off",
           _e(TRAIN, "clip_grad_norm_(model.parameters(), max_norm=1.0)",
              "clip_grad_norm_(model.parameters(), max_norm=1.0, foreach=False)"),
           "clip_grad_norm_(..., foreach=False): per-parameter norm kernels",
           (GPT2,), ("foreach", "train.py:{line}")),
    Change("deepcopy_state_per_step",
           _e(TRAIN, "                optimizer.step()\n                losses.append",
              "                optimizer.step()\n"
              "                final_state = copy.deepcopy(model.state_dict())\n"
              "                losses.append"),
           "a copy.deepcopy(model.state_dict()) every step (checkpointing in the hot loop)",
           (CNN,), ("deepcopy", "state_dict", "train.py:{line}")),
    Change("ddp_find_unused_parameters",
           _e(DDP_SCRIPT, "model = DDP(MLP(features=64, hidden=256))",
              "model = DDP(MLP(features=64, hidden=256), find_unused_parameters=True)"),
           "DDP find_unused_parameters=True: a graph traversal every backward (Tuning Guide / "
           "DDP notes: only when parameters really go unused)",
           (DDP,), ("find_unused_parameters",)),
    Change("python_collate",
           _e(DATA, "        shuffle=True,\n        num_workers=num_workers,\n",
              "        shuffle=True,\n        collate_fn=stack_samples,\n"
              "        num_workers=num_workers,\n"),
           "a hand-written Python collate_fn instead of the default (no shared-memory batch, "
           "per-sample Python)",
           (CNN,), ("collate_fn",)),
    Change("total_keeps_graph",
           _e(TRAIN, "total = total + loss.detach()", "total = total + loss"),
           "total = total + loss: every micro-batch's graph kept alive through the running "
           "total (FAQ: don't accumulate history across your training loop)",
           (ACCUM,), ("train.py:{line}",)),
    Change("fewer_workers",
           _e(DATA, "batch_size: int = 32, num_workers: int = 2)",
              "batch_size: int = 32, num_workers: int = 1)"),
           "DataLoader num_workers 2 -> 1 (Tuning Guide: enable async data loading)",
           (CNN,), ("num_workers",)),
    Change("detect_anomaly",
           _e(TRAIN, "    optimizer = torch.optim.AdamW(",
              "    torch.autograd.set_detect_anomaly(True)\n    optimizer = torch.optim.AdamW("),
           "autograd anomaly detection left on (Tuning Guide: disable debugging APIs)",
           (GPT2,), ("anomaly",)),
    Change("gradient_checkpointing",
           _e(TRAIN, "    model.train()\n    predictions, val_losses",
              "    model.gradient_checkpointing_enable()\n"
              "    model.train()\n    predictions, val_losses"),
           "GPT-2 gradient checkpointing on: every block's forward recomputed in backward "
           "(trades compute for memory)",
           (GPT2,), ("checkpoint",)),
    Change("heavy_augmentation",
           _e(DATA, "        image = (image - 0.5) / 0.25\n",
              "        image = F.conv2d(image[None], torch.full((3, 1, 7, 7), 1 / 49), padding=3, "
              "groups=3)[0]\n        image = (image - 0.5) / 0.25\n"),
           "a heavier augmentation in Dataset.__getitem__: a 7x7 blur convolution per sample",
           (CNN,), ("data.py:{line}", "__getitem__")),
    Change("ddp_no_sync_missing",
           _e(DDP_SCRIPT, "with contextlib.nullcontext() if sync else model.no_sync():",
              "with contextlib.nullcontext():"),
           "gradient accumulation under DDP without no_sync(): an all-reduce every micro-batch "
           "(Tuning Guide: skip unnecessary all-reduce with no_sync)",
           (DDP,), ("no_sync", "ddp_train.py:{line}")),
    Change("autocast_bf16",
           _e(TRAIN, 'torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)',
              'torch.autocast("cpu", dtype=torch.bfloat16, enabled=True)'),
           "CPU autocast to bfloat16 turned on (reversed: removed) (Tuning Guide: use mixed "
           "precision)",
           (ACCUM,), ("autocast", "bfloat16")),
    Change("eval_without_no_grad",
           _e(TRAIN, "@torch.no_grad()\ndef evaluate(", "def evaluate("),
           "the per-step validation forward without torch.no_grad(): a graph built and, kept "
           "in val_losses, kept alive (Tuning Guide: disable gradient calculation for "
           "validation or inference)",
           (GPT2,), ("no_grad", "train.py:{line}", "evaluate")),
    Change("deterministic_algorithms",
           _e(TRAIN, "    optimizer = torch.optim.AdamW(",
              "    torch.use_deterministic_algorithms(True)\n    optimizer = torch.optim.AdamW("),
           "torch.use_deterministic_algorithms(True) (Tuning Guide: disable debugging APIs / "
           "deterministic settings unless needed)",
           (GPT2,), ("deterministic",)),
    Change("pin_memory_on",
           _e(DATA, "        pin_memory=False,\n", "        pin_memory=True,\n"),
           "DataLoader pin_memory=True on a CPU-only machine: torch turns it off (nothing to "
           "pin to), so the step is the same and must pass; on a GPU runner the Tuning Guide's "
           "pinned host-to-device copies are a setting row",
           (CNN,), harmless=True),
    Change("persistent_workers_off",
           _e(DATA, "        persistent_workers=num_workers > 0,\n",
              "        persistent_workers=False,\n"),
           "DataLoader persistent_workers=False: the workers restart every epoch",
           (CNN,), ("persistent_workers",)),
    Change("prefetch_factor_1",
           _e(DATA, "prefetch_factor=2 if num_workers > 0 else None",
              "prefetch_factor=1 if num_workers > 0 else None"),
           "DataLoader prefetch_factor 2 -> 1: one batch in flight per worker",
           (CNN,), ("prefetch_factor",)),
    Change("batch_size_64",
           _e(DATA, "batch_size: int = 32, num_workers: int = 2)",
              "batch_size: int = 64, num_workers: int = 2)"),
           "DataLoader batch_size 32 -> 64 (twice the work per step, half the steps)",
           (CNN,), ("batch_size",)),
)

BY_NAME = {c.name: c for c in CHANGES}
#: Names a driver accepts for several changes at once.
GROUPS = {
    "all": [c.name for c in CHANGES],
    "issue31": [c.name for c in CHANGES if 31 in c.issue],
    "issue32": [c.name for c in CHANGES if 32 in c.issue],
}


def select(names: list[str]) -> list[Change]:
    """Changes by name or group (``all``, ``issue31``, ``issue32``), in corpus order."""
    wanted: list[str] = []
    for name in names:
        for n in GROUPS.get(name, [name]):
            if n not in BY_NAME:
                raise KeyError(f"no such change: {n!r} (known: {', '.join(BY_NAME)}; groups: "
                               f"{', '.join(GROUPS)})")
            if n not in wanted:
                wanted.append(n)
    return [BY_NAME[n] for n in wanted]


if __name__ == "__main__":
    for c in CHANGES:
        tests = ", ".join(t.rsplit("::", 1)[-1] for t in c.tests)
        said = "must pass" if c.harmless else "cause: " + " | ".join(c.expected_causes())
        print(f"{c.name:28} issue {'/'.join(map(str, c.issue)):5} {tests:24} {said}")
        print(f"{'':28} {c.what}")
