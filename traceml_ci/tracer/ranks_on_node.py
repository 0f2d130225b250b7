"""After a distributed launch (``traceml-ci run --nproc-per-node ...``): make sure the merged
summary says which ranks did not report.

The ranks merge their summaries themselves at finish (tracer/distributed.py). When a rank
dies, the others' gather fails, and rank 0 writes only what it has. The launcher on the node
that ran rank 0 then reads the per-rank files in its output folder and writes the merged
summary again, naming the missing ranks of this node as failed. Only local files are read:
nothing travels between machines here. Torch-free, like the rest of the launcher.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from traceml_ci.summary.keys import SUMMARY_FILENAME
from traceml_ci.tracer.identity import rank_summary_name


def _option(args: Sequence[str], *names: str) -> str | None:
    """The value of a torchrun option, given as ``--name V`` or ``--name=V``."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def local_ranks(torchrun: Sequence[str]) -> tuple[list[int], int] | None:
    """(the global ranks this node ran, the world size) for a static launch; None when
    torchrun decides them at rendezvous (several nodes meeting at an --rdzv-endpoint, elastic
    node counts) or ``nproc`` is not a number."""
    nproc = _int(_option(torchrun, "--nproc-per-node", "--nproc_per_node"), 0)
    nnodes_text = _option(torchrun, "--nnodes") or "1"
    if nproc <= 0 or ":" in nnodes_text:
        return None
    nnodes = _int(nnodes_text, 1)
    rendezvous = any(a.startswith(("--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-backend",
                                   "--rdzv_backend")) for a in torchrun)
    if nnodes > 1 and rendezvous:
        return None  # the rendezvous, not --node-rank, decides which ranks run here
    node = _int(_option(torchrun, "--node-rank", "--node_rank"), 0)
    return [node * nproc + i for i in range(nproc)], nnodes * nproc


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def complete_merged_summary(out_dir: Path, torchrun: Sequence[str],
                            env: Mapping[str, str] | None = None) -> Path | None:
    """Rewrite ``out_dir/final_summary.json`` from the per-rank files when the ranks' own merge
    is missing or incomplete, on the node that ran rank 0; returns the path written, if any."""
    placed = local_ranks(torchrun)
    if placed is None:
        return None
    mine, world = placed
    if 0 not in mine:
        return None  # another node writes the merged summary
    merged_path = out_dir / SUMMARY_FILENAME
    merged = _read(merged_path)
    dist = (merged or {}).get("distributed") or {}
    if dist.get("ranks_reported") == world and dist.get("world_size") == world:
        return None  # the ranks merged everything themselves
    docs = {r: d for r in range(world)
            if (d := _read(out_dir / rank_summary_name(r))) is not None}
    if not docs:
        return None
    from traceml_ci.summary.io import write_summary
    from traceml_ci.summary.ranks import merge_ranks

    failed = [r for r in mine if r not in docs]
    ordered = [docs[r] for r in sorted(docs)]
    out = merge_ranks(ordered, world_size=world, failed=failed, nodes=world // len(mine),
                      backend=dist.get("backend"))
    return write_summary(merged_path, out)
