"""FSDP2 (``fully_shard``) on CPU/gloo under ``traceml-ci run --nproc-per-node 2``: every rank
traced, one merged summary. (What the straggler analysis can and cannot tell under FSDP is in
docs/distributed.md.)"""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_run_distributed import _finish, _free_port, _merged, _start

FSDP_SCRIPT = '''
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import traceml_ci as traceml

torch.set_num_threads(1)
traceml.init(run_name="fsdp", warmup_steps=3)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 64), torch.randn(16, 1)
for _ in range(20):
    with traceml.trace_step(model):
        opt.zero_grad(set_to_none=True)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
dist.destroy_process_group()
'''


def test_fully_shard_job_on_gloo_is_traced_and_merged(tmp_path: Path) -> None:
    (tmp_path / "train_fsdp.py").write_text(FSDP_SCRIPT)
    code, out = _finish(_start(tmp_path, "--out", "out", "--nproc-per-node", "2",
                               "--master-port", str(_free_port()), "train_fsdp.py"))
    assert code == 0, out
    assert (tmp_path / "out" / "final_summary.rank1.json").is_file()
    doc = _merged(tmp_path / "out" / "final_summary.json")
    dist = doc["distributed"]
    assert (dist["world_size"], dist["ranks_reported"], dist["backend"]) == (2, 2, "gloo")
    assert doc["run"]["status"] == "completed" and doc["run"]["name"] == "fsdp"
    for row in dist["ranks"]:
        assert row["status"] == "completed" and row["steps_analyzed"] == 17
        # FSDP all-gathers parameters inside forward: forward holds real time on every rank.
        assert row["phase_ms"]["forward"] > 0 and row["phase_ms"]["backward"] > 0
    # Detected as FSDP: the straggler analysis says why it gives no label (docs/distributed.md).
    assert doc["run"]["parallelism"] == "fsdp"
    assert dist["straggler"]["label"] is None and "FSDP" in dist["straggler"]["not_analysed"]
