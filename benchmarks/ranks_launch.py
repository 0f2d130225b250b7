"""Shared by the distributed benchmarks: a script launched again as N local CPU ranks (gloo)
under torchrun, each rank printing its figures as JSON lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: Set in each rank's environment: the script runs its rank side, not its launcher.
RANK_ENV = "TRACEML_CI_BENCH_RANK"


def is_rank() -> bool:
    """Whether this process is one of the ranks ``launch_ranks`` started."""
    return bool(os.environ.get(RANK_ENV))


def launch_ranks(script: str, n: int, args: Sequence[str]) -> list[dict[str, Any]]:
    """``script args`` as ``n`` ranks under torchrun on a free local port, one OpenMP thread
    each; the JSON objects the ranks printed (lines starting ``{``), in the order printed.
    A failed launch exits with the ranks' stderr tail."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, RANK_ENV: "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
         "--master-addr", "127.0.0.1", "--master-port", str(port), script, *args],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"torchrun with {n} ranks failed ({out.returncode}):\n"
                         f"{out.stderr[-2000:]}")
    return [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
