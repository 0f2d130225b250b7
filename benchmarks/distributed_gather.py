"""Time added at finish by the cross-rank gather (tracer/distributed.py), on CPU with gloo.

    .venv/bin/python benchmarks/distributed_gather.py [--ranks 2 4] [--repeats 20]

For each world size, torchrun starts that many ranks of this file; each makes the tracer's own
gloo group (RankGather, as a traced job does right after init_process_group), then gathers a
real summary (tests/gate/data/input_bound_a.json, ~6 KB) ``--repeats`` times and rank 0 reports
the median and max time of one gather. The merge itself (summary/ranks.py) is timed apart.
The per-step path has no distributed branch: a DDP step costs the tracer what a single-process
step does (recorder.py is the same code either way).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.ranks_launch import is_rank, launch_ranks  # noqa: E402

SUMMARY = REPO / "tests" / "gate" / "data" / "input_bound_a.json"


def _rank_main(repeats: int) -> None:
    import torch.distributed as dist

    from traceml_ci.summary.ranks import merge_ranks
    from traceml_ci.tracer.distributed import RankGather

    dist.init_process_group("gloo")
    gather = RankGather(lambda: None, lambda m: print(m, file=sys.stderr))
    doc = json.loads(SUMMARY.read_text())
    doc["run"]["rank"] = dist.get_rank()
    times, merge_s = [], 0.0
    for _ in range(repeats):
        gather._make_group(dist)  # a fresh group each time: gather() destroys its group
        dist.barrier()
        t0 = time.perf_counter()
        docs = gather.gather(doc)
        times.append(time.perf_counter() - t0)
        if dist.get_rank() == 0 and docs:
            t1 = time.perf_counter()
            merge_ranks(docs, world_size=dist.get_world_size())
            merge_s = time.perf_counter() - t1
    if dist.get_rank() == 0:
        print(json.dumps({"world": dist.get_world_size(),
                          "median_ms": 1e3 * statistics.median(times),
                          "max_ms": 1e3 * max(times), "merge_ms": 1e3 * merge_s}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    for n in args.ranks:
        (r,) = launch_ranks(__file__, n, ["--repeats", str(args.repeats)])  # rank 0's line
        print(f"{r['world']} ranks: gather median {r['median_ms']:.1f} ms, max "
              f"{r['max_ms']:.1f} ms; merge on rank 0 {r['merge_ms']:.1f} ms")


if __name__ == "__main__":
    if is_rank():
        rp = argparse.ArgumentParser()
        rp.add_argument("--repeats", type=int, default=20)
        _rank_main(rp.parse_args().repeats)
    else:
        main()
