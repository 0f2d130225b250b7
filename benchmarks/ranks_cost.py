"""What a traced DDP job's finish costs each rank, and how large its summaries are, per rank count.

    .venv/bin/python benchmarks/ranks_cost.py [--ranks 2 4] [--launches 3] [--steps 40]

For each world size, torchrun starts that many CPU ranks (gloo) of this file ``--launches``
times; each rank traces a small DDP job (examples/train_ddp.py's model, every rank balanced)
with ``traceml.init()`` and then, after a barrier so all arrive together, times its own
``traceml.finish()``: building the summary, writing ``final_summary.rank<N>.json``, the
gather (``RankGather.gather``, timed apart) and on rank 0 the merge (``merge_ranks``, timed
apart) and the merged file's write. It prints each world size's medians over ranks and
launches (max beside) and the sizes of the merged and per-rank files. Unlike
distributed_gather.py (the gather alone, repeated, on a stored summary) this is the real
finish of a real traced job, once per launch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.ranks_launch import is_rank, launch_ranks  # noqa: E402


def _timed(owner: object, name: str, into: dict[str, float]) -> None:
    """Replace ``owner.name`` by a wrapper that adds its wall time (ms) to ``into[name]``."""
    original = getattr(owner, name)

    def wrapper(*args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[name] = into.get(name, 0.0) + 1e3 * (time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def _rank_main(out_dir: str, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import traceml_ci as traceml
    import traceml_ci.summary.ranks as ranks
    from traceml_ci.tracer.distributed import RankGather

    sys.path.insert(0, str(REPO / "examples"))
    from train_ddp import Net

    took: dict[str, float] = {}
    _timed(RankGather, "gather", took)
    _timed(ranks, "merge_ranks", took)  # the session imports it at finish, from the module
    torch.set_num_threads(1)
    traceml.init(run_name="ranks_cost", warmup_steps=5, out_dir=out_dir, live=False)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 64), torch.randn(8, 1)
    for _ in range(steps):
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
    dist.barrier()  # all ranks start finishing together: the gather waits for no straggler
    t0 = time.perf_counter()
    traceml.finish()
    finish_ms = 1e3 * (time.perf_counter() - t0)
    print(json.dumps({"rank": dist.get_rank(), "finish_ms": finish_ms,
                      "gather_ms": took.get("gather"), "merge_ms": took.get("merge_ranks")}),
          flush=True)
    dist.destroy_process_group()


def _med_max(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ms (max {max(values):.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    for n in args.ranks:
        rows: list[dict[str, float]] = []
        merged_b: list[int] = []
        rank_b: list[int] = []
        for _ in range(args.launches):
            with tempfile.TemporaryDirectory() as tmp:
                rows += launch_ranks(__file__, n, ["--out", tmp, "--steps", str(args.steps)])
                merged_b.append((Path(tmp) / "final_summary.json").stat().st_size)
                rank_b += [f.stat().st_size for f in Path(tmp).glob("final_summary.rank*.json")]
        finish = [r["finish_ms"] for r in rows]
        gather = [r["gather_ms"] for r in rows if r.get("gather_ms") is not None]
        merge = [r["merge_ms"] for r in rows if r.get("merge_ms") is not None]
        print(f"{n} ranks ({args.launches} launches, {len(rows)} rank finishes): "
              f"finish {_med_max(finish)}, of it the gather {_med_max(gather)}, "
              f"rank 0's merge {_med_max(merge)}; merged summary "
              f"{statistics.median(merged_b):,.0f} B, per-rank file "
              f"{statistics.median(rank_b):,.0f} B (max {max(rank_b):,})")


if __name__ == "__main__":
    if is_rank():
        rp = argparse.ArgumentParser()
        rp.add_argument("--out", required=True)
        rp.add_argument("--steps", type=int, default=40)
        a = rp.parse_args()
        _rank_main(a.out, a.steps)
    else:
        main()
